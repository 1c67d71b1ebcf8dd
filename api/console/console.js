// The agentfleet console: plain modules, no build step, nothing loaded from outside the host
// (the Content-Security-Policy allows only this origin). Every text that came from a run —
// model replies, tool arguments and results, questions — is hostile and goes into the page
// through textContent only, never as markup.

const KEY = "agentfleet.key"; // sessionStorage only: gone when the tab closes
const STATUSES = [
  "queued", "running", "waiting_for_input", "waiting_for_confirmation",
  "waiting_for_thread", "waiting_for_tasks", "waiting_for_slot", "completed", "failed", "cancelled",
];
const ENDED = new Set(["completed", "failed", "cancelled"]);
const EVENT_TYPES = [
  "run_queued", "run_started", "run_recovered", "iteration_started", "message_delta",
  "message_completed", "tool_started", "tool_completed", "input_required",
  "confirmation_required", "run_resumed", "run_completed", "run_failed", "run_cancelled",
  "stream_rebuilt", "context_compacted", "plan_created", "task_completed", "round_completed",
];
const TERMINAL = new Set(["run_completed", "run_failed", "run_cancelled"]);
const PAUSING = new Set(["input_required", "confirmation_required"]);
// Events after which the run's status or usage changed: the page reads the run again.
const REFRESHING = new Set(["run_resumed", "message_completed", "plan_created", "round_completed"]);
const POLL_MS = 2000;
// A stream that cannot be reopened (its token refused, the API gone) is retried this many
// times, backing off up to RETRY_MAX_MS, then the page says so and stops.
const MAX_REOPENS = 30;
const RETRY_MAX_MS = 10000;

const main = document.getElementById("main");
let cleanup = () => {};

// ---- helpers ---------------------------------------------------------------------------

/** An element: `h("a", {href: "#/"}, "text", child)`. Strings become text nodes. */
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

function pretty(value) {
  if (typeof value === "string") {
    try { return JSON.stringify(JSON.parse(value), null, 2); } catch { return value; }
  }
  return JSON.stringify(value, null, 2);
}

// UUIDv7 ids made at about the same time share their first digits: show both ends.
function short(id) { return id ? `${String(id).slice(0, 8)}…${String(id).slice(-4)}` : ""; }

function when(iso) { return iso ? new Date(iso).toLocaleString() : ""; }

function toast(text) {
  const t = document.getElementById("toast");
  t.textContent = text;
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 5000);
}

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function call(method, path, body) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { /* not JSON: reported below */ }
  if (!res.ok) {
    if (res.status === 401) { signOut("The API key was refused; sign in again."); }
    throw new ApiError(res.status, json?.error?.code, json?.error?.message || `HTTP ${res.status}`);
  }
  return json;
}

/** Runs `fn` now and every `ms` while the tab is visible, one call at a time. */
function poll(fn, ms) {
  let busy = false;
  let stopped = false;
  const tick = async () => {
    if (busy || stopped || document.hidden) return;
    busy = true;
    try { await fn(); } catch (e) { if (!(e instanceof ApiError)) console.error(e); }
    finally { busy = false; }
  };
  tick();
  const timer = setInterval(tick, ms);
  return () => { stopped = true; clearInterval(timer); };
}

// A thread holds at most this many pages of messages for the console (500 each): a longer
// one is shown up to there.
const MAX_MESSAGE_PAGES = 20;

/** The thread's messages after id `after`, page by page; answers the last id seen. */
async function eachMessage(threadId, after, fn) {
  for (let page = 0; page < MAX_MESSAGE_PAGES; page++) {
    const res = await call("GET", `/v1/threads/${threadId}/messages?after=${after}&limit=500`);
    for (const m of res.data) fn(m);
    if (res.data.length) after = res.data[res.data.length - 1].id;
    if (res.next_after == null) break;
  }
  return after;
}

function contentText(body) {
  return typeof body?.content === "string" ? body.content : pretty(body?.content ?? "");
}

function badge(status) {
  return h("span", { class: `badge ${status}` }, status.replaceAll("_", " "));
}

/** "task 2 of round 1": a task's place in its plan (`task_index` counts from 0). */
function taskPlace(round, taskIndex) { return `task ${Number(taskIndex) + 1} of round ${round}`; }

/** What a run is in a plan, for the lists: a planner, or a task of one. */
function planTag(r) {
  if (r.parent_run_id && r.task) {
    return h("span", { class: "tag", title: r.task.title ?? "" }, `task ${r.task.round}.${r.task.task_index + 1}`);
  }
  return r.mode === "plan_and_solve" ? h("span", { class: "tag" }, "planner") : null;
}

/** A task's error as one line: `code: message`. */
function errorLine(e) {
  if (!e) return "";
  return typeof e === "object" ? `${e.code ?? "error"}: ${e.message ?? ""}` : String(e);
}

// ---- routing ---------------------------------------------------------------------------

function route() {
  cleanup();
  cleanup = () => {};
  main.replaceChildren();
  const key = sessionStorage.getItem(KEY);
  document.getElementById("nav").hidden = !key;
  if (!key) { cleanup = signInView() || (() => {}); return; }
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  if (parts[0] === "runs" && parts[1]) cleanup = runView(parts[1]);
  else if (parts[0] === "threads" && parts[1]) cleanup = threadView(parts[1]);
  else cleanup = runsView(params);
}

function signOut(message) {
  sessionStorage.removeItem(KEY);
  route();
  if (message) toast(message);
}

window.addEventListener("hashchange", route);
document.getElementById("sign-out").addEventListener("click", () => signOut());
route();

// ---- sign in ---------------------------------------------------------------------------

function signInView() {
  const error = h("p", { class: "error", id: "sign-in-error", role: "alert" });
  const input = h("input", {
    id: "api-key", type: "password", autocomplete: "off", required: true,
    placeholder: "af_…", "aria-label": "API key",
  });
  const form = h("form", { id: "sign-in", class: "card narrow" },
    h("h1", {}, "Sign in"),
    h("p", {}, "Your API key stays in this tab's session storage and is sent only to this API."),
    h("label", { for: "api-key" }, "API key"), input,
    h("button", { type: "submit" }, "Sign in"), error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    error.textContent = "";
    sessionStorage.setItem(KEY, input.value.trim());
    try {
      await call("GET", "/v1/runs?limit=1");
      route();
    } catch (err) {
      sessionStorage.removeItem(KEY);
      main.replaceChildren(form);
      error.textContent = err.status === 401 ? "That key was refused." : `Could not sign in: ${err.message}`;
    }
  });
  main.append(form);
  input.focus();
}

// ---- runs list -------------------------------------------------------------------------

function runsView(params) {
  const filters = {
    status: params.get("status") || "",
    thread_id: params.get("thread_id") || "",
    batch_id: params.get("batch_id") || "",
  };
  const status = h("select", { id: "filter-status", name: "status" },
    h("option", { value: "" }, "any status"),
    STATUSES.map((s) => h("option", { value: s, selected: s === filters.status }, s)));
  const thread = h("input", { id: "filter-thread", name: "thread_id", placeholder: "thread id", value: filters.thread_id });
  const batch = h("input", { id: "filter-batch", name: "batch_id", placeholder: "batch id", value: filters.batch_id });
  const form = h("form", { id: "filters", class: "filters" }, status, thread, batch,
    h("button", { type: "submit" }, "Filter"),
    h("a", { href: "#/" }, "clear"));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const [k, el] of [["status", status], ["thread_id", thread], ["batch_id", batch]]) {
      if (el.value.trim()) q.set(k, el.value.trim());
    }
    location.hash = `#/?${q}`;
  });
  const counts = h("div", { id: "counts", class: "counts" });
  const error = h("p", { class: "error", role: "alert" });
  const body = h("tbody", { id: "runs" });
  const more = h("button", { type: "button", id: "older", hidden: true }, "Older runs");
  main.append(h("h1", {}, "Runs"), form, counts, error,
    h("table", { class: "runs" },
      h("thead", {}, h("tr", {}, ["run", "status", "thread", "created", "iteration", "tokens"].map((c) => h("th", {}, c)))),
      body),
    more);

  const query = (extra = {}) => {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries({ ...filters, ...extra })) if (v) q.set(k, v);
    return q.toString();
  };
  let cursor = null;
  let pagedBeyondFirst = false;
  const row = (r) => h("tr", { dataset: { runId: r.id } },
    h("td", {}, h("a", { href: `#/runs/${r.id}`, class: "mono" }, short(r.id)), " ", planTag(r)),
    h("td", {}, badge(r.status)),
    h("td", {}, h("a", { href: `#/threads/${r.thread_id}`, class: "mono" }, short(r.thread_id))),
    h("td", {}, when(r.created_at)),
    h("td", {}, `${r.iteration}/${r.max_iterations}`),
    h("td", {}, String(r.usage?.total_tokens ?? 0)));

  const refresh = async () => {
    const c = await call("GET", `/v1/runs/counts?${query({ status: "" })}`);
    counts.replaceChildren(...STATUSES.map((s) => h("a", {
      class: `count ${s}`, href: `#/?${query({ status: s })}`, dataset: { status: s },
    }, h("b", {}, String(c.counts[s] ?? 0)), " ", s.replaceAll("_", " "))));
    if (c.counted >= c.window) counts.append(h("span", { class: "muted" }, `of the newest ${c.window} runs`));
    if (pagedBeyondFirst) return; // do not pull the rows away from someone reading older pages
    const page = await call("GET", `/v1/runs?${query({ limit: 50 })}`);
    body.replaceChildren(...page.data.map(row));
    if (!page.data.length) body.append(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No runs.")));
    cursor = page.next_cursor;
    more.hidden = !cursor;
    error.textContent = "";
  };
  more.addEventListener("click", async () => {
    pagedBeyondFirst = true;
    try {
      const page = await call("GET", `/v1/runs?${query({ limit: 50, cursor })}`);
      body.append(...page.data.map(row));
      cursor = page.next_cursor;
      more.hidden = !cursor;
    } catch (e) { error.textContent = e.message; }
  });
  return poll(() => refresh().catch((e) => { error.textContent = e.message; throw e; }), POLL_MS);
}

// ---- one run ---------------------------------------------------------------------------

function runView(id) {
  let run = null;
  let es = null;
  let lastId = 0;
  let reopens = 0;
  let reopenTimer = null;
  let closed = false;
  let iteration = 0;
  const bubbles = new Map(); // iteration -> {el, text}
  const tools = new Map(); // tool_call_id -> card
  const shownMessages = new Set();

  const statusEl = h("span", { id: "run-status" });
  const usageEl = h("dl", { id: "run-usage", class: "usage" });
  const connEl = h("span", { id: "stream-state", class: "muted" });
  const cancel = h("button", { type: "button", id: "cancel", class: "danger" }, "Cancel run");
  const meta = h("p", { class: "meta" });
  const taskOf = h("p", { id: "task-of", class: "task-of", hidden: true });
  const pending = h("section", { id: "pending", hidden: true });
  const plan = planTree(id);
  const convo = h("ol", { id: "conversation", class: "conversation" });
  const log = h("ol", { id: "event-log", class: "event-log" });
  main.append(
    h("h1", {}, "Run ", h("span", { class: "mono" }, id), " ", statusEl),
    meta, taskOf, h("div", { class: "toolbar" }, cancel, connEl), usageEl, pending, plan.el, convo,
    h("details", { class: "raw" }, h("summary", {}, "Events as received"), log));

  const showRun = (r) => {
    run = r;
    statusEl.replaceChildren(badge(r.status));
    statusEl.dataset.status = r.status;
    meta.replaceChildren("thread ", h("a", { href: `#/threads/${r.thread_id}`, class: "mono", id: "thread-link" }, r.thread_id),
      ` · model ${r.agent?.model ?? "?"} · created ${when(r.created_at)}`,
      r.finished_at ? ` · finished ${when(r.finished_at)}` : "",
      r.error ? h("span", { class: "error" }, ` · ${r.error.code}: ${r.error.message}`) : "");
    const u = r.usage || {};
    usageEl.replaceChildren(...[
      ["prompt tokens", u.prompt_tokens], ["completion tokens", u.completion_tokens],
      ["total tokens", u.total_tokens], ["tool calls", u.tool_calls], ["iterations", `${r.iteration}/${r.max_iterations}`],
    ].flatMap(([k, v]) => [h("dt", {}, k), h("dd", { dataset: { usage: k.replaceAll(" ", "_") } }, String(v ?? 0))]));
    if (u.estimated) usageEl.append(h("dt", {}, "note"), h("dd", {}, "partly estimated"));
    cancel.hidden = ENDED.has(r.status);
    renderPending(r);
    if (r.parent_run_id && r.task && !taskOf.dataset.parent) {
      taskOf.dataset.parent = r.parent_run_id;
      taskOf.hidden = false;
      taskOf.replaceChildren(`${taskPlace(r.task.round, r.task.task_index)} of `,
        h("a", { href: `#/runs/${r.parent_run_id}`, id: "parent-link", class: "mono", title: r.parent_run_id }, short(r.parent_run_id)),
        r.task.title ? h("span", { class: "task-title" }, ` · ${r.task.title}`) : "");
    }
    if (r.mode === "plan_and_solve") plan.showPlan(r.plan);
  };
  const refreshRun = async () => showRun(await call("GET", `/v1/runs/${id}`));

  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    try { showRun(await call("POST", `/v1/runs/${id}/cancel`)); }
    catch (e) { toast(`Cancel failed: ${e.message}`); }
    finally { cancel.disabled = false; }
  });

  // The user's own messages are not events: read them from the thread.
  const showUserMessages = async () => {
    if (!run) return;
    await eachMessage(run.thread_id, 0, (m) => {
      if (m.run_id !== id || m.role !== "user" || shownMessages.has(m.id)) return;
      shownMessages.add(m.id);
      convo.append(h("li", { class: "msg user", dataset: { messageId: m.id } }, h("div", { class: "who" }, "user"), h("div", { class: "text" }, contentText(m.body))));
    });
  };

  const showRejections = async () => {
    const awaiting = (card) => card.result.textContent === "awaiting approval";
    if (!run || ![...tools.values()].some(awaiting)) return;
    await eachMessage(run.thread_id, 0, (m) => {
      const card = m.role === "tool" && m.run_id === id && tools.get(m.body?.tool_call_id);
      if (!card || !awaiting(card)) return;
      card.result.textContent = contentText(m.body);
      card.classList.add("failed", "rejected");
    });
  };

  const note = (text, cls = "") => convo.append(h("li", { class: `note ${cls}` }, text));

  const bubble = (it) => {
    let b = bubbles.get(it);
    if (!b) {
      const text = h("div", { class: "text" });
      const el = h("li", { class: "msg assistant streaming", dataset: { iteration: it } }, h("div", { class: "who" }, `assistant · iteration ${it}`), text);
      convo.append(el);
      b = { el, text };
      bubbles.set(it, b);
    }
    return b;
  };

  const toolCard = (callId, name, args) => {
    let card = tools.get(callId);
    if (!card) {
      const result = h("pre", { class: "result" }, "running…");
      card = h("li", { class: "tool", dataset: { toolCallId: callId, name } },
        h("div", { class: "who" }, `tool · ${name}`),
        h("pre", { class: "args" }, pretty(args)), result);
      card.result = result;
      tools.set(callId, card);
      convo.append(card);
    }
    return card;
  };

  const onEvent = (msg) => {
    let ev;
    try { ev = JSON.parse(msg.data); } catch { return; }
    if (typeof ev.id !== "number" || ev.id <= lastId) return; // replayed after a reconnect
    if (lastId && ev.id !== lastId + 1) log.dataset.gap = `${lastId}->${ev.id}`;
    lastId = ev.id;
    reopens = 0;
    log.append(h("li", { dataset: { eventId: ev.id, type: ev.type } }, `${ev.id} ${ev.type}`));
    render(ev);
    if (TERMINAL.has(ev.type)) closeStream("ended");
    else if (PAUSING.has(ev.type)) setConn("paused: waiting for an answer");
    if (TERMINAL.has(ev.type) || PAUSING.has(ev.type) || REFRESHING.has(ev.type)) {
      refreshRun().catch(() => {});
    }
  };

  const render = (ev) => {
    const d = ev.data || {};
    switch (ev.type) {
      case "run_queued": note("queued"); break;
      case "run_started": note(`started on ${d.worker} (attempt ${d.attempt})`); break;
      case "run_recovered": {
        // The interrupted iteration is redone: its partial text is dropped.
        const b = bubbles.get(d.iteration);
        if (b) { b.el.remove(); bubbles.delete(d.iteration); }
        note(`recovered on ${d.worker} (attempt ${d.attempt}); iteration ${d.iteration} is redone`, "warn");
        break;
      }
      case "iteration_started":
        iteration = d.iteration;
        // A planner's `complete` call has no `tool_completed`: the summary turn follows it.
        if (run?.mode === "plan_and_solve") {
          for (const card of tools.values()) {
            if (card.dataset.name === "complete" && !card.classList.contains("done")) {
              card.result.textContent = "the plan is complete; the summary follows";
              card.classList.add("done");
            }
          }
        }
        break;
      case "message_delta": {
        // What streamed is kept beside what is shown, so a test can tell a duplicate or a
        // missing delta from the final text.
        const b = bubble(iteration);
        b.text.append(d.text ?? "");
        b.el.dataset.streamed = (b.el.dataset.streamed ?? "") + (d.text ?? "");
        break;
      }
      case "message_completed": {
        const b = bubble(d.iteration ?? iteration);
        b.text.textContent = d.content ?? "";
        b.el.classList.remove("streaming");
        if (!d.content) b.el.classList.add("empty");
        if (d.usage) b.el.append(h("div", { class: "muted small" }, `${d.usage.prompt_tokens}+${d.usage.completion_tokens} tokens${d.usage.estimated ? " (estimated)" : ""}`));
        for (const c of d.tool_calls || []) toolCard(c.id, c.name, c.arguments);
        break;
      }
      case "tool_started": {
        const card = toolCard(d.tool_call_id, d.name, d.arguments);
        card.result.textContent = d.dispatch > 1 ? `running… (dispatch ${d.dispatch})` : "running…";
        break;
      }
      case "tool_completed": {
        const card = toolCard(d.tool_call_id, d.name, {});
        card.result.textContent = pretty(d.ok ? d.result : (d.error ?? d.result));
        card.classList.toggle("failed", !d.ok);
        card.classList.add("done");
        break;
      }
      case "input_required": note(`waiting for input: ${d.question ?? ""}`, "pause"); break;
      case "confirmation_required":
        note(`waiting for approval of ${(d.tool_calls || []).map((c) => c.name).join(", ")}`, "pause");
        for (const c of d.tool_calls || []) toolCard(c.tool_call_id, c.name, c.arguments).result.textContent = "awaiting approval";
        break;
      case "run_resumed":
        note(`resumed (${d.kind})`);
        // Rejected calls get their result with the resume and never run: no event says so.
        if (d.kind === "confirmation") showRejections().catch(() => {});
        else showUserMessages().catch(() => {});
        break;
      case "run_completed": note("completed", "end ok"); break;
      case "run_failed": note(`failed: ${d.code}: ${d.message ?? ""}`, "end bad"); break;
      case "run_cancelled": note(`cancelled (was ${d.previous_status})`, "end bad"); break;
      case "stream_rebuilt": note("Redis lost this run's events; what Postgres holds is shown from here", "warn"); break;
      case "context_compacted": note(`context compacted to fit ${d.budget_tokens} tokens`); break;
      case "plan_created": {
        const tasks = Array.isArray(d.tasks) ? d.tasks : [];
        for (const t of tasks) plan.setTask({ ...t, round: d.round });
        note(`round ${d.round} planned: ${tasks.length} task${tasks.length === 1 ? "" : "s"} — ${tasks.map((t) => t.title ?? "untitled").join(" · ")}`, "plan");
        break;
      }
      case "task_completed": {
        plan.setTask(d);
        const detail = d.status === "completed" ? d.output ?? "" : errorLine(d.error);
        note(`${taskPlace(d.round, d.task_index)} “${d.title ?? "untitled"}” ${d.status}${detail ? `: ${detail}` : ""}`,
          d.status === "completed" ? "task ok" : "task bad");
        break;
      }
      case "round_completed": {
        plan.roundDone(d);
        note(`round ${d.round} done: ${d.tasks} task${d.tasks === 1 ? "" : "s"} (${statusCounts(d.statuses)})`, "plan");
        break;
      }
      default: note(ev.type);
    }
  };

  // ---- pending question or calls
  const renderPending = (r) => {
    const p = r.pending;
    const waiting = r.status === "waiting_for_input" || r.status === "waiting_for_confirmation";
    if (!waiting || !p) { pending.hidden = true; pending.replaceChildren(); delete pending.dataset.for; return; }
    const key = `${r.status}:${r.updated_at}`;
    if (pending.dataset.for === key) return; // keep what the user is typing
    pending.dataset.for = key;
    pending.hidden = false;
    const error = h("p", { class: "error", id: "pending-error", role: "alert" });
    if (r.status === "waiting_for_input") {
      const answer = h("textarea", { id: "answer", rows: 3, required: true, "aria-label": "Answer" });
      const form = h("form", { class: "card" }, h("h2", {}, "The agent asks"),
        h("p", { class: "question" }, p.question ?? ""), answer,
        h("button", { type: "submit", id: "send-answer" }, "Answer"), error);
      form.addEventListener("submit", async (e) => {
        e.preventDefault();
        await resume({ input: answer.value }, form, error);
      });
      pending.replaceChildren(form);
    } else {
      const calls = (p.tool_calls || []).map((c) => h("fieldset", { class: "decision", dataset: { callId: c.tool_call_id } },
        h("legend", {}, `${c.name} · risk ${c.risk ?? "?"}`),
        h("pre", { class: "args" }, pretty(c.arguments)),
        h("label", {}, h("input", { type: "radio", name: `d-${c.tool_call_id}`, value: "approve", required: true }), " approve"),
        h("label", {}, h("input", { type: "radio", name: `d-${c.tool_call_id}`, value: "reject" }), " reject"),
        h("input", { type: "text", class: "reason", placeholder: "reason (optional)", "aria-label": `reason for ${c.name}` })));
      const form = h("form", { class: "card" }, h("h2", {}, "Approve or reject"), calls,
        h("button", { type: "submit", id: "send-decisions" }, "Send decisions"), error);
      form.addEventListener("submit", async (e) => {
        e.preventDefault();
        const decisions = calls.map((f) => {
          const choice = f.querySelector("input[type=radio]:checked")?.value;
          const reason = f.querySelector(".reason").value.trim();
          return { tool_call_id: f.dataset.callId, approve: choice === "approve", ...(reason ? { reason } : {}) };
        });
        await resume({ decisions }, form, error);
      });
      pending.replaceChildren(form);
    }
  };

  const resume = async (body, form, error) => {
    for (const el of form.elements) el.disabled = true;
    try {
      await call("POST", `/v1/runs/${id}/resume`, body);
      pending.hidden = true;
      pending.replaceChildren();
      toast("Sent; the run resumes.");
    } catch (e) {
      error.textContent = e.message;
      for (const el of form.elements) el.disabled = false;
    }
  };

  // ---- the stream
  const closeStream = (state) => {
    closed = true;
    clearTimeout(reopenTimer);
    if (es) es.close();
    connEl.textContent = state;
    connEl.dataset.state = state;
  };
  const setConn = (state) => { connEl.textContent = state; connEl.dataset.state = state; };

  // A stream token is made for each opening: the browser's EventSource cannot send the key.
  const openStream = async () => {
    if (closed) return;
    let url;
    try {
      url = new URL((await call("POST", `/v1/runs/${id}/stream-token`)).url, location.origin);
    } catch (e) {
      return scheduleReopen(e.message);
    }
    if (closed) return;
    if (lastId) url.searchParams.set("after", lastId);
    es = new EventSource(url);
    for (const t of EVENT_TYPES) es.addEventListener(t, onEvent);
    es.addEventListener("message", onEvent);
    es.onopen = () => setConn("live");
    es.onerror = () => {
      // CONNECTING: the browser reconnects by itself, with Last-Event-ID. CLOSED: it gave up
      // (an answer that was not a stream, such as an expired token): open a new one.
      if (closed) return;
      if (es.readyState === EventSource.CLOSED) scheduleReopen("stream closed");
      else setConn("reconnecting");
    };
  };
  const scheduleReopen = (why) => {
    if (closed) return;
    if (es) es.close();
    reopens += 1;
    if (reopens > MAX_REOPENS) { closeStream(`disconnected (${why}); reload to try again`); return; }
    setConn(`reconnecting (${why}, attempt ${reopens})`);
    reopenTimer = setTimeout(openStream, Math.min(RETRY_MAX_MS, 250 * 2 ** reopens));
  };

  (async () => {
    try {
      await refreshRun();
      await showUserMessages();
      await openStream();
    } catch (e) {
      main.append(h("p", { class: "error", role: "alert" }, e.status === 404 ? "No such run." : e.message));
    }
  })();
  const stopPolling = poll(() => (run && !ENDED.has(run.status) ? refreshRun() : null), 5000);
  // A planner's tasks change status without an event on its own stream (a task starting,
  // pausing): their list is read while it runs, and once more after it ended.
  let tasksFinal = false;
  const stopTasks = poll(() => {
    if (!run || run.mode !== "plan_and_solve" || tasksFinal) return null;
    if (ENDED.has(run.status)) tasksFinal = true;
    return plan.refresh();
  }, POLL_MS);
  return () => { closeStream("closed"); stopPolling(); stopTasks(); };
}

function statusCounts(statuses) {
  return Object.entries(statuses || {}).map(([s, n]) => `${n} ${s.replaceAll("_", " ")}`).join(", ");
}

/**
 * A planner's rounds and their tasks, each task a link to its own run. Fed by the run
 * (`plan`), the planner's events and `GET /v1/runs/{id}/tasks`, in whatever order they come:
 * an ended task's status is never replaced by an older one.
 */
function planTree(runId) {
  const summary = h("span", { id: "plan-summary", class: "muted small" });
  const roundsEl = h("div", { id: "plan-rounds" });
  const el = h("section", { id: "plan", class: "plan", hidden: true },
    h("h2", {}, "Plan ", summary), roundsEl);
  const rounds = new Map(); // round -> {el, list, state}
  const tasks = new Map(); // task run id -> {el, status, ...}

  const roundOf = (n) => {
    let r = rounds.get(n);
    if (r) return r;
    const state = h("span", { class: "round-state muted small" });
    const list = h("ol", { class: "tasks" });
    r = { el: h("section", { class: "round", dataset: { round: n } }, h("h3", {}, `Round ${n} `, state), list), list, state, done: null };
    const next = [...rounds.keys()].filter((k) => k > n).sort((a, b) => a - b)[0];
    roundsEl.insertBefore(r.el, next === undefined ? null : rounds.get(next).el);
    rounds.set(n, r);
    el.hidden = false;
    return r;
  };

  const showRoundState = (r) => {
    if (r.done) { r.state.textContent = `done · ${statusCounts(r.done)}`; return; }
    const all = [...tasks.values()].filter((t) => t.round === Number(r.el.dataset.round));
    r.state.textContent = `${all.filter((t) => ENDED.has(t.status)).length} of ${all.length} ended`;
  };

  const setTask = (t) => {
    if (!t || typeof t.run_id !== "string" || !Number.isInteger(t.round) || !Number.isInteger(t.task_index)) return;
    let task = tasks.get(t.run_id);
    const r = roundOf(t.round);
    if (!task) {
      const status = h("span", { class: "task-status" });
      const title = h("a", { href: `#/runs/${t.run_id}`, class: "task-link" });
      const detail = h("div", { class: "task-detail muted small" });
      const li = h("li", { class: "task", dataset: { runId: t.run_id, round: t.round, taskIndex: t.task_index } },
        h("span", { class: "task-index" }, `${t.task_index + 1}.`), title, " ", status, " ",
        h("a", { href: `#/runs/${t.run_id}`, class: "mono muted small" }, short(t.run_id)), detail);
      task = { el: li, title, status: null, statusEl: status, detail, round: t.round, taskIndex: t.task_index };
      const after = [...r.list.children].find((c) => Number(c.dataset.taskIndex) > t.task_index);
      r.list.insertBefore(li, after ?? null);
      tasks.set(t.run_id, task);
    }
    if (typeof t.title === "string" || !task.title.textContent) task.title.textContent = t.title ?? "untitled";
    // An ended status is final: a late answer read before the task ended does not undo it.
    if (typeof t.status === "string" && !(ENDED.has(task.status) && !ENDED.has(t.status)) && t.status !== task.status) {
      task.status = t.status;
      task.el.dataset.status = t.status;
      task.statusEl.replaceChildren(badge(t.status));
    }
    if (t.status === "completed" && typeof t.output === "string") task.detail.textContent = t.output;
    else if (t.error) task.detail.textContent = errorLine(t.error);
    if (Number.isInteger(t.total_tokens) && t.total_tokens > 0 && !task.detail.textContent) {
      task.detail.textContent = `${t.total_tokens} tokens`;
    }
    showRoundState(r);
  };

  const roundDone = (d) => {
    if (!Number.isInteger(d.round)) return;
    const r = roundOf(d.round);
    r.done = d.statuses || {};
    r.el.dataset.done = "true";
    showRoundState(r);
  };

  const showPlan = (p) => {
    if (!p) return;
    el.hidden = false;
    summary.textContent = `${p.rounds_created} round${p.rounds_created === 1 ? "" : "s"} · ${p.task_tokens} task tokens · ${p.total_tokens} tokens in all`;
    for (const round of p.rounds || []) for (const t of round.tasks || []) setTask(t);
  };

  const refresh = async () => {
    const res = await call("GET", `/v1/runs/${runId}/tasks`);
    for (const t of res.data || []) setTask(t);
  };

  return { el, setTask, roundDone, showPlan, refresh };
}

// ---- one thread ------------------------------------------------------------------------

function threadView(id) {
  const runs = h("tbody", { id: "thread-runs" });
  const msgs = h("ol", { id: "thread-messages", class: "conversation" });
  const error = h("p", { class: "error", role: "alert" });
  main.append(h("h1", {}, "Thread ", h("span", { class: "mono" }, id)), error,
    h("h2", {}, "Runs"),
    h("table", { class: "runs" }, h("thead", {}, h("tr", {}, ["run", "status", "created", "tokens"].map((c) => h("th", {}, c)))), runs),
    h("h2", {}, "Messages"), msgs);
  let after = 0;
  const refresh = async () => {
    const page = await call("GET", `/v1/runs?thread_id=${id}&limit=100`);
    runs.replaceChildren(...page.data.map((r) => h("tr", { dataset: { runId: r.id } },
      h("td", {}, h("a", { href: `#/runs/${r.id}`, class: "mono" }, short(r.id)), " ", planTag(r)),
      h("td", {}, badge(r.status)), h("td", {}, when(r.created_at)),
      h("td", {}, String(r.usage?.total_tokens ?? 0)))));
    after = await eachMessage(id, after, (m) => msgs.append(messageItem(m)));
    error.textContent = "";
  };
  return poll(() => refresh().catch((e) => { error.textContent = e.status === 404 ? "No such thread." : e.message; throw e; }), 3000);
}

function messageItem(m) {
  const b = m.body || {};
  const parts = [h("div", { class: "who" }, `${m.role}${m.run_id ? ` · run ${short(m.run_id)}` : ""}`)];
  if (typeof b.content === "string" && b.content) parts.push(h("div", { class: "text" }, b.content));
  else if (b.content && typeof b.content !== "string") parts.push(h("pre", {}, pretty(b.content)));
  for (const c of b.tool_calls || []) parts.push(h("pre", { class: "args" }, `${c.function?.name ?? c.name}(${c.function?.arguments ?? pretty(c.arguments)})`));
  return h("li", { class: `msg ${m.role}`, dataset: { messageId: m.id } }, ...parts);
}
