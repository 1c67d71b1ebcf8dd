import assert from "node:assert/strict";
import { test } from "node:test";

import { AgentfleetClient } from "../dist/index.js";
import { client, collect, cutProxy, key, model, script } from "./helpers.mjs";

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
