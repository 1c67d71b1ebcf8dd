import assert from "node:assert/strict";
import { test } from "node:test";

import { AgentfleetClient, StreamError } from "../dist/index.js";
import { apiUrl, client, collect, cutProxy, key, model, script } from "./helpers.mjs";

// About 60 deltas 30 ms apart: the stream is cut twice while the run is still going.
const SLOW = { content: Array.from({ length: 60 }, (_, i) => `w${String(i).padStart(2, "0")} `).join(""), chunks: 60, chunk_delay_ms: 30 };

test("a stream cut twice mid-run yields every event exactly once, in order", async () => {
  const proxy = await cutProxy();
  try {
    const af = client();
    const run = await af.runs.create(script(SLOW), { agent: { model: model() } });
    const throughProxy = new AgentfleetClient({ apiKey: key(), baseUrl: proxy.url });
    const cuts = new Map([[5, false], [25, false]]);
    const events = [];
    for await (const event of throughProxy.runs.stream(run.id)) {
      events.push(event);
      if (cuts.has(events.length)) {
        assert.notEqual(event.type, "run_completed", "the run ended before the cut");
        cuts.set(events.length, true);
        proxy.cut();
      }
    }
    assert.ok([...cuts.values()].every(Boolean));
    assert.ok(proxy.connections >= 3, `two reconnections (${proxy.connections} connections)`);
    assert.deepEqual(events.map((e) => e.id), events.map((_, i) => i + 1));
    assert.equal(events.at(-1).type, "run_completed");
    const text = events.filter((e) => e.type === "message_delta").map((e) => e.data.text).join("");
    assert.equal(text, SLOW.content);
    // What a reader that was never cut gets is the same, event for event.
    const replay = await collect(af.runs.stream(run.id));
    assert.deepEqual(replay, events);
  } finally {
    await proxy.close();
  }
});

test("a stream resumes after a given id", async () => {
  const af = client();
  const run = await af.runs.create(script({ content: "one two three" }), { agent: { model: model() } });
  const everything = await collect(af.runs.stream(run.id));
  const tail = await collect(af.runs.stream(run.id, { after: 3 }));
  assert.deepEqual(tail.map((e) => e.id), everything.slice(3).map((e) => e.id));
});

test("a thread stream follows its runs one after another, across a cut", async () => {
  const proxy = await cutProxy();
  try {
    const af = client();
    const first = await af.runs.create(script(SLOW), { agent: { model: model() } });
    const second = await af.runs.create(script({ content: "second answer" }), {
      agent: { model: model() },
      thread_id: first.thread_id,
      if_busy: "enqueue",
    });
    const throughProxy = new AgentfleetClient({ apiKey: key(), baseUrl: proxy.url });
    const events = [];
    for await (const event of throughProxy.threads.stream(first.thread_id)) {
      events.push(event);
      if (events.length === 10) proxy.cut();
      if (event.run_id === second.id && event.type === "run_completed") break;
    }
    assert.ok(proxy.connections >= 2);
    const split = events.findIndex((e) => e.run_id === second.id);
    assert.ok(events.slice(0, split).every((e) => e.run_id === first.id));
    assert.ok(events.slice(split).every((e) => e.run_id === second.id));
    for (const part of [events.slice(0, split), events.slice(split)]) {
      assert.deepEqual(part.map((e) => e.id), part.map((_, i) => i + 1));
      assert.equal(part.at(-1).type, "run_completed");
    }
    // Resuming from an event of the first run gives the rest, from the next one on.
    const after = events[split - 3];
    const rest = [];
    for await (const event of af.threads.stream(first.thread_id, { lastEventId: `${after.run_id}:${after.id}` })) {
      rest.push(event);
      if (event.run_id === second.id && event.type === "run_completed") break;
    }
    assert.deepEqual(rest.map((e) => [e.run_id, e.id]), events.slice(split - 2).map((e) => [e.run_id, e.id]));
  } finally {
    await proxy.close();
  }
});

test("an event longer than the bound is a StreamError", async () => {
  const af = client();
  const run = await af.runs.create(script({ content: "x".repeat(2000) }), { agent: { model: model() } });
  assert.equal((await collect(af.runs.stream(run.id))).at(-1).type, "run_completed");
  const bounded = new AgentfleetClient({ apiKey: key(), baseUrl: apiUrl(), maxEventChars: 1000 });
  await assert.rejects(collect(bounded.runs.stream(run.id)), (e) => e instanceof StreamError && /longer than 1000/.test(e.message));
});

test("a stream outlives an unavailable API", async () => {
  const proxy = await cutProxy();
  try {
    const run = await client().runs.create(script(SLOW), { agent: { model: model() } });
    // No retries of a request's own: the stream itself resumes after the 503s.
    const throughProxy = new AgentfleetClient({ apiKey: key(), baseUrl: proxy.url, maxRetries: 0 });
    const events = [];
    for await (const event of throughProxy.runs.stream(run.id)) {
      events.push(event);
      if (events.length === 5) {
        proxy.refuseNext(2);
        proxy.cut();
      }
    }
    assert.equal(proxy.refused, 2);
    assert.deepEqual(events.map((e) => e.id), events.map((_, i) => i + 1));
    assert.equal(events.at(-1).type, "run_completed");
  } finally {
    await proxy.close();
  }
});
