// Every call of the client once, against the API: each answers what its name says.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { client, collect, model, receiver, script } from "./helpers.mjs";

test("runs, threads and webhooks calls", async () => {
  const af = client();
  const created = await af.runs.createMany([0, 1].map((i) => ({ input: script({ content: `hello ${i}` }), agent: { model: model() } })));
  const ids = created.runs.map((r) => r.id);
  assert.equal(ids.length, 2);
  for (const id of ids) assert.equal((await collect(af.runs.stream(id))).at(-1).type, "run_completed");
  const page = await af.runs.list({ status: "completed", batch_id: created.batch_id, limit: 1 });
  assert.equal(page.data.length, 1);
  assert.ok(page.next_cursor);
  assert.deepEqual((await collect(af.runs.iter({ batch_id: created.batch_id, limit: 1 }))).map((r) => r.id).sort(), [...ids].sort());
  assert.equal((await af.runs.counts({ batch_id: created.batch_id })).counts.completed, 2);
  const token = await af.runs.streamToken(ids[0]);
  assert.ok(token.token && token.url.includes(ids[0]));
  const idempotencyKey = randomUUID();
  const first = await af.runs.create("keyed", { agent: { model: model() }, idempotencyKey });
  const again = await af.runs.create("keyed", { agent: { model: model() }, idempotencyKey });
  assert.equal(again.id, first.id);
  assert.equal((await collect(af.runs.stream(first.id))).at(-1).type, "run_completed");
  assert.equal((await af.threads.messages(first.thread_id, { limit: 1 })).data[0].role, "user");

  const hooks = await receiver();
  const hook = await af.webhooks.create({ url: hooks.url("/hook"), events: ["run.failed"] });
  try {
    assert.ok((await af.webhooks.list()).data.some((e) => e.id === hook.id));
    assert.deepEqual((await af.webhooks.get(hook.id)).events, ["run.failed"]);
    const rotated = await af.webhooks.rotateSecret(hook.id);
    assert.match(rotated.secret, /^whsec_/);
    assert.notEqual(rotated.secret, hook.secret);
  } finally {
    await af.webhooks.delete(hook.id);
    await hooks.close();
  }
});

test("batches from an async iterable", async () => {
  const af = client();
  async function* items() {
    yield { input: "a", agent: { model: model() } };
    yield { input: "b", agent: { model: model() } };
  }
  const submission = await af.batches.create(items(), { label: "ts-async", chunkSize: 1 });
  assert.deepEqual(submission.batches.map((b) => b.total), [1, 1]);
  const ids = submission.batches.map((b) => b.id);
  await af.batches.wait(ids, { pollMs: 200, timeoutMs: 60_000 });
  const outputs = [];
  for (const id of ids) for await (const r of af.batches.results(id, { finishedOnly: true })) outputs.push([r.custom_id, r.output]);
  assert.deepEqual(outputs, [["item-1", "echo: a"], ["item-2", "echo: b"]]);
});
