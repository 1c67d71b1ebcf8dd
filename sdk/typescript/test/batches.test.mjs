import assert from "node:assert/strict";
import { test } from "node:test";

import { client, collect, model } from "./helpers.mjs";

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
