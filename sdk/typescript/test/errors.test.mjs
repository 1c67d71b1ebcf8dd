import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import {
  AgentfleetClient,
  APIConnectionError,
  ConflictError,
  InternalServerError,
  NotFoundError,
  RateLimitError,
  UnprocessableEntityError,
} from "../dist/index.js";
import { apiUrl, client, collect, cutProxy, key, limitedKey, model, script } from "./helpers.mjs";

test("404 is a NotFoundError", async () => {
  const error = await client().runs.get(randomUUID()).catch((e) => e);
  assert.ok(error instanceof NotFoundError, String(error));
  assert.equal(error.status, 404);
  assert.equal(error.code, "not_found");
  assert.ok(error.message);
});

test("409 is a ConflictError", async () => {
  const af = client();
  const run = await af.runs.create(script({ content: "done" }), { agent: { model: model() } });
  assert.equal((await collect(af.runs.stream(run.id))).at(-1).type, "run_completed");
  const error = await af.runs.answer(run.id, "too late").catch((e) => e);
  assert.ok(error instanceof ConflictError, String(error));
  assert.equal(error.status, 409);
  assert.match(error.message, /completed/);
});

test("422 is an UnprocessableEntityError naming the field", async () => {
  const error = await client().runs.create("hello", { agent: { model: model(), max_iterations: 0 } }).catch((e) => e);
  assert.ok(error instanceof UnprocessableEntityError, String(error));
  assert.equal(error.code, "invalid_request");
  assert.match(error.message, /agent\.max_iterations/);
});

test("429 is a RateLimitError after retries that honour Retry-After", async () => {
  // The tenant may have one active run: a run waiting for input holds it.
  const af = new AgentfleetClient({ apiKey: limitedKey(), baseUrl: apiUrl(), maxRetries: 1 });
  const waiting = await af.runs.create(script({ tool_calls: [{ name: "ask", arguments: { text: "?" } }] }), { agent: { model: model() } });
  try {
    const started = Date.now();
    const error = await af.runs.create("one more", { agent: { model: model() } }).catch((e) => e);
    assert.ok(error instanceof RateLimitError, String(error));
    assert.equal(error.code, "too_many_active_runs");
    assert.ok(error.retryAfter >= 1);
    // One retry, after the Retry-After the API asked for.
    assert.ok(Date.now() - started >= error.retryAfter * 1000);
  } finally {
    await af.runs.cancel(waiting.id);
  }
});

test("no answer is an APIConnectionError", async () => {
  const af = new AgentfleetClient({ apiKey: "af_none", baseUrl: "http://127.0.0.1:9", maxRetries: 0 });
  const error = await af.runs.get(randomUUID()).catch((e) => e);
  assert.ok(error instanceof APIConnectionError, String(error));
});

test("5xx is retried only for a safe request", async () => {
  const proxy = await cutProxy();
  try {
    const af = new AgentfleetClient({ apiKey: key(), baseUrl: proxy.url, maxRetries: 1 });
    // A create without a key could have been carried out: it is not sent again.
    proxy.refuseNext(1);
    const error = await af.runs.create("not sent twice", { agent: { model: model() } }).catch((e) => e);
    assert.ok(error instanceof InternalServerError, String(error));
    assert.equal(error.status, 503);
    assert.equal(error.code, "unavailable");
    assert.equal(error.retryAfter, 1);
    assert.equal(proxy.refused, 1);
    // With an Idempotency-Key it is, after the Retry-After.
    proxy.refuseNext(1);
    const started = Date.now();
    const run = await af.runs.create("sent twice", { agent: { model: model() }, idempotencyKey: randomUUID() });
    assert.equal(proxy.refused, 2);
    assert.ok(Date.now() - started >= 1000);
    assert.equal((await af.runs.get(run.id)).id, run.id);
  } finally {
    await proxy.close();
  }
});
