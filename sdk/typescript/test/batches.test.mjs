import assert from "node:assert/strict";
import { test } from "node:test";

import { client, collect, model, waitFor } from "./helpers.mjs";

// An iterable that is no array: the runs are produced as they are sent.
function* items(n) {
  for (let i = 1; i <= n; i++) yield { custom_id: `doc-${i}`, input: `summarise document ${i}`, agent: { model: model() } };
}

test("a batch of 500 from an iterable, with progress", async () => {
  const af = client();
  const submitted = [];
  const options = { chunkSize: 200, metadata: { job: "sdk-test" }, label: "ts-500" };
  const submission = await af.batches.create(items(500), { ...options, onProgress: (n) => submitted.push(n) });
  assert.deepEqual(submitted, [200, 400, 500]);
  assert.equal(submission.total, 500);
  assert.deepEqual(submission.created, [true, true, true]);
  assert.deepEqual(submission.batches.map((b) => b.total), [200, 200, 100]);
  const ids = submission.batches.map((b) => b.id);

  // The same items again: the idempotency keys find the same batches, nothing is created twice.
  const again = await af.batches.create(items(500), options);
  assert.deepEqual(again.batches.map((b) => b.id), ids);
  assert.deepEqual(again.created, [false, false, false]);

  const progress = [];
  const finished = await af.batches.wait(ids, {
    pollMs: 500,
    timeoutMs: 120_000,
    onProgress: (bs) => progress.push(bs.reduce((n, b) => n + b.counts.completed, 0)),
  });
  assert.deepEqual(finished.map((b) => b.status), ["completed", "completed", "completed"]);
  assert.equal(progress.at(-1), 500);
  assert.deepEqual(progress, [...progress].sort((a, b) => a - b));

  const results = [];
  for (const id of ids) results.push(...(await collect(af.batches.results(id))));
  assert.deepEqual(results.map((r) => r.custom_id), Array.from({ length: 500 }, (_, i) => `doc-${i + 1}`));
  assert.ok(results.every((r) => r.status === "completed"));
  assert.equal(results[41].output, "echo: summarise document 42");
});

test("a cancelled batch ends cancelled and says so per item", async () => {
  const af = client();
  const slow = { input: JSON.stringify({ mock_script: [{ content: "x", delay_ms: 10_000 }] }), agent: { model: model() } };
  const submission = await af.batches.create(Array.from({ length: 5 }, () => ({ ...slow })), { label: "ts-cancel" });
  const id = submission.batches[0].id;
  assert.ok(["cancelling", "cancelled"].includes((await af.batches.cancel(id)).status));
  const [finished] = await af.batches.wait([id], { pollMs: 200, timeoutMs: 60_000 });
  assert.equal(finished.status, "cancelled");
  const results = await collect(af.batches.results(id));
  assert.deepEqual(results.map((r) => r.custom_id), ["item-1", "item-2", "item-3", "item-4", "item-5"]);
  assert.ok(results.every((r) => r.status === "cancelled"));
  assert.ok((await af.batches.list({ limit: 50 })).batches.some((b) => b.id === id));
});

test("usage counts the tenant's runs", async () => {
  const af = client();
  const before = (await af.usage.get()).total.runs;
  const run = await af.runs.create("count me", { agent: { model: model() } });
  assert.equal((await collect(af.runs.stream(run.id))).at(-1).type, "run_completed");
  const report = await waitFor("the run in the usage", 30_000, async () => {
    const r = await af.usage.get();
    return r.total.runs > before && r;
  });
  assert.ok(report.total.total_tokens > 0);
  assert.ok(report.days.length > 0 && report.days.every((d) => report.from <= d.day && d.day <= report.to));
});
