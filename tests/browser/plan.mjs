// A plan-and-solve run in the console, in headless Chromium: the planner's page shows its
// rounds and tasks as they progress, each task links to its own run page (its own stream), and
// a task's page links back to the planner. Environment: CONSOLE_URL, CONSOLE_KEY,
// CONSOLE_RUN_BODY (the planner's `POST /v1/runs` body), SCREENSHOTS (optional). Prints what
// the page showed (tests/tests/e2e/console.rs checks it against the API).

import { drive, env, signIn, startRun } from "./lib.mjs";

const base = env("CONSOLE_URL");
const key = env("CONSOLE_KEY");
const runBody = JSON.parse(env("CONSOLE_RUN_BODY"));
const shots = process.env.SCREENSHOTS;
const ENDED = ["completed", "failed", "cancelled"];

/** What a run page shows: its status, stream state, event log, replies and notes. */
async function runPage(page) {
  return {
    status: await page.$eval("#run-status", (el) => el.dataset.status),
    stream: await page.$eval("#stream-state", (el) => el.dataset.state ?? null),
    events: await page.$$eval("#event-log li", (lis) => lis.map((li) => ({ id: Number(li.dataset.eventId), type: li.dataset.type }))),
    gap: await page.$eval("#event-log", (el) => el.dataset.gap || null),
    replies: await page.$$eval(".msg.assistant:not(.empty) .text", (els) => els.map((el) => el.textContent)),
    notes: await page.$$eval("#conversation .note", (els) => els.map((el) => ({ class: el.className, text: el.textContent }))),
    tools: await page.$$eval("#conversation .tool", (els) => els.map((el) => ({ name: el.dataset.name, result: el.querySelector(".result").textContent }))),
  };
}

/** A task's page, opened from a link: its place in the plan and its link back. */
async function taskPage(page, status) {
  await page.waitForSelector("#task-of:not([hidden])");
  await page.waitForSelector(`#run-status[data-status="${status}"]`);
  await page.waitForSelector('#stream-state[data-state="ended"]');
  return {
    url: page.url(),
    taskOf: await page.textContent("#task-of"),
    parentHref: await page.getAttribute("#parent-link", "href"),
    planHidden: await page.$eval("#plan", (el) => el.hidden),
    ...(await runPage(page)),
  };
}

await drive(async (page, out) => {
  await signIn(page, base, key);
  const runId = await startRun(page, base, key, runBody);
  out.runId = runId;
  await page.goto(`${base}/console/#/runs/${runId}`);

  // Every status the page shows, for the planner and each task, as it changes: the tree is
  // updated live, not only at the end.
  await page.waitForSelector("#plan", { state: "attached" });
  await page.evaluate(() => {
    const seen = { run: [], tasks: {} };
    const push = (list, s) => { if (s && list[list.length - 1] !== s) list.push(s); };
    const record = () => {
      push(seen.run, document.getElementById("run-status")?.dataset.status);
      for (const li of document.querySelectorAll("#plan li.task")) {
        push(seen.tasks[li.dataset.runId] ??= [], li.dataset.status);
      }
    };
    record();
    new MutationObserver(record).observe(document.getElementById("main"), { subtree: true, childList: true, attributes: true });
    window.__seen = seen;
  });

  // The first round shows up while it runs, its second task waiting for a slot.
  await page.waitForSelector('#plan .round[data-round="1"] li.task[data-status="waiting_for_slot"]');
  if (shots) await page.screenshot({ path: `${shots}/console-plan.png`, fullPage: true });

  await page.waitForSelector('#run-status[data-status="completed"]');
  await page.waitForSelector('#stream-state[data-state="ended"]');
  await page.waitForFunction((ended) => {
    const tasks = [...document.querySelectorAll("#plan li.task")];
    return tasks.length >= 3 && tasks.every((li) => ended.includes(li.dataset.status));
  }, ENDED);

  out.seen = await page.evaluate(() => window.__seen);
  out.summary = await page.textContent("#plan-summary");
  out.tree = await page.$$eval("#plan .round", (rounds) => rounds.map((r) => ({
    round: Number(r.dataset.round),
    done: r.dataset.done === "true",
    state: r.querySelector(".round-state").textContent,
    tasks: [...r.querySelectorAll("li.task")].map((li) => ({
      runId: li.dataset.runId,
      taskIndex: Number(li.dataset.taskIndex),
      title: li.querySelector(".task-link").textContent,
      href: li.querySelector(".task-link").getAttribute("href"),
      status: li.dataset.status,
      badge: li.querySelector(".badge").textContent,
      detail: li.querySelector(".task-detail").textContent,
    })),
  })));
  out.parent = await runPage(page);

  // The first task of round 1, from its link: its own stream, and the way back.
  await page.click('#plan .round[data-round="1"] li.task[data-task-index="0"] .task-link');
  out.firstTask = await taskPage(page, "completed");
  await page.click("#parent-link");
  await page.waitForSelector('#plan .round[data-round="2"] li.task[data-status="completed"]');
  out.backAtParent = page.url();

  // The second task of round 1 failed: its page says so, and where it belongs.
  await page.click('#plan .round[data-round="1"] li.task[data-task-index="1"] .task-link');
  out.secondTask = await taskPage(page, "failed");

  // The runs list tags the planner and its tasks, and the new statuses can be filtered on.
  await page.goto(`${base}/console/#/?status=waiting_for_tasks`);
  await page.waitForSelector('#counts .count[data-status="waiting_for_slot"]');
  out.filterOptions = await page.$$eval("#filter-status option", (os) => os.map((o) => o.value));
  out.filterSelected = await page.$eval("#filter-status", (s) => s.value);
  out.countStatuses = await page.$$eval("#counts .count", (cs) => cs.map((c) => c.dataset.status));
  await page.goto(`${base}/console/#/`);
  await page.waitForSelector(`#runs tr[data-run-id="${runId}"] .tag`);
  out.tags = await page.$$eval("#runs tr", (trs) => Object.fromEntries(trs.map((tr) => [tr.dataset.runId, tr.querySelector(".tag")?.textContent ?? null])));
});
