import assert from "node:assert/strict";
import { test } from "node:test";

import { client, collect, model, receiver, script } from "./helpers.mjs";

const PAY = {
  name: "pay",
  kind: "http",
  risk: "high",
  description: "Pays an invoice.",
  parameters: { type: "object", properties: { amount: { type: "number" } }, required: ["amount"] },
};

test("create → stream → answer → approve → completed", async () => {
  const tools = await receiver();
  try {
    const af = client();
    const run = await af.runs.create(
      script(
        { content: "Which invoice?", tool_calls: [{ name: "ask", arguments: { text: "Which invoice?" } }] },
        { content: "Paying.", tool_calls: [{ name: "pay", arguments: { amount: 42 } }] },
        { content: "Paid the March invoice." },
      ),
      { agent: { model: model(), tools: [{ ...PAY, url: tools.url("/pay") }] }, metadata: { suite: "typescript" } },
    );
    assert.equal(run.status, "queued");

    const events = [];
    for await (const event of af.runs.stream(run.id)) {
      events.push(event);
      if (event.type === "input_required") {
        assert.equal(event.data.question, "Which invoice?");
        await af.runs.answer(run.id, "The March one");
      } else if (event.type === "confirmation_required") {
        assert.deepEqual(event.data.tool_calls.map((c) => c.name), ["pay"]);
        assert.deepEqual(tools.posts("/pay"), [], "no call ran before the decision");
        await af.runs.approve(run.id);
      }
    }

    assert.deepEqual(events.map((e) => e.id), events.map((_, i) => i + 1));
    const types = events.map((e) => e.type);
    assert.equal(types[0], "run_queued");
    assert.equal(types.at(-1), "run_completed");
    let at = -1;
    for (const t of ["input_required", "run_resumed", "confirmation_required", "run_resumed", "tool_completed", "run_completed"]) {
      at = types.indexOf(t, at + 1);
      assert.ok(at >= 0, `${t} in order in ${types}`);
    }
    const done = events.find((e) => e.type === "tool_completed");
    assert.equal(done.data.ok, true);
    assert.deepEqual(tools.posts("/pay").map((r) => JSON.parse(r.body).arguments), [{ amount: 42 }]);

    const final = await af.runs.get(run.id);
    assert.equal(final.status, "completed");
    assert.deepEqual(final.metadata, { suite: "typescript" });
    const messages = await collect(af.threads.iterMessages(final.thread_id));
    assert.equal(messages.at(-1).role, "assistant");
    const runs = await collect(af.threads.runsOf(final.thread_id));
    assert.ok(runs.some((r) => r.id === run.id));
  } finally {
    await tools.close();
  }
});

test("reject: the call never runs and the run goes on", async () => {
  const tools = await receiver();
  try {
    const af = client();
    const run = await af.runs.create(script({ tool_calls: [{ name: "pay", arguments: { amount: 7 } }] }, { content: "Not paid." }), {
      agent: { model: model(), tools: [{ ...PAY, url: tools.url("/pay") }] },
    });
    const first = await collect(af.runs.stream(run.id, { stopAtPause: true }));
    assert.equal(first.at(-1).type, "confirmation_required");
    await af.runs.reject(run.id, undefined, "not this month");
    const rest = await collect(af.runs.stream(run.id, { after: first.at(-1).id }));
    assert.equal(rest[0].id, first.at(-1).id + 1);
    assert.equal(rest.at(-1).type, "run_completed");
    assert.deepEqual(tools.posts("/pay"), []);
  } finally {
    await tools.close();
  }
});

test("cancel", async () => {
  const af = client();
  const run = await af.runs.create(script({ content: "x", delay_ms: 5000 }), { agent: { model: model() } });
  assert.equal((await af.runs.cancel(run.id)).status, "cancelled");
  const page = await af.runs.list({ limit: 5 });
  assert.ok(page.data.some((r) => r.id === run.id));
});
