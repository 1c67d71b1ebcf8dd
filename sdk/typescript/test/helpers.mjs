// The suite runs against a real stack that scripts/sdk-test starts: the API at
// AGENTFLEET_SDK_TEST_URL, a tenant's key in AGENTFLEET_SDK_TEST_KEY, a tenant limited to one
// active run in AGENTFLEET_SDK_TEST_LIMITED_KEY, the scripted model as AGENTFLEET_SDK_TEST_MODEL.
// The model plays the script a run's input carries (tests/src/mock_llm.rs); the tools and the
// webhook receiver are this process's own HTTP server.
import http from "node:http";
import net from "node:net";

import { AgentfleetClient } from "../dist/index.js";

function env(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run the suite with scripts/sdk-test`);
  return value;
}

export const apiUrl = () => env("AGENTFLEET_SDK_TEST_URL");
export const model = () => env("AGENTFLEET_SDK_TEST_MODEL");
export const key = () => env("AGENTFLEET_SDK_TEST_KEY");
export const limitedKey = () => env("AGENTFLEET_SDK_TEST_LIMITED_KEY");
export const client = (options = {}) => new AgentfleetClient({ apiKey: key(), baseUrl: apiUrl(), ...options });

/** A run's input that scripts the model's answers, one turn per model call. */
export const script = (...turns) => JSON.stringify({ mock_script: turns });

/** Polls `probe` until it returns something truthy; fails naming `what` at the deadline. */
export async function waitFor(what, timeoutMs, probe) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() >= deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export async function collect(iterable) {
  const out = [];
  for await (const x of iterable) out.push(x);
  return out;
}

/** Tools and a webhook receiver: records every POST (path, headers, raw body). */
export async function receiver() {
  const requests = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      requests.push({ path: req.url, headers: req.headers, body });
      let args = null;
      try {
        args = JSON.parse(body.toString()).arguments ?? null;
      } catch {}
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ ok: true, arguments: args }));
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const port = server.address().port;
  return {
    requests,
    url: (path) => `http://127.0.0.1:${port}${path}`,
    posts: (path) => requests.filter((r) => r.path === path),
    close: () => new Promise((r) => server.close(r)),
  };
}

/** A TCP proxy to the API whose `cut()` breaks every connection open through it. */
export async function cutProxy() {
  const target = new URL(apiUrl());
  const open = new Set();
  let connections = 0;
  let refuse = 0;
  let refused = 0;
  const server = net.createServer((down) => {
    if (refuse > 0) {
      // As an API replica that cannot reach its services answers.
      refuse -= 1;
      refused += 1;
      const body = '{"error": {"code": "unavailable", "message": "a backing service cannot be reached"}}';
      down.on("error", () => {});
      down.once("data", () =>
        down.end(`HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`),
      );
      return;
    }
    connections += 1;
    const up = net.connect(Number(target.port), target.hostname);
    for (const s of [down, up]) {
      open.add(s);
      s.on("error", () => {});
      s.on("close", () => open.delete(s));
    }
    down.pipe(up);
    up.pipe(down);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    get connections() {
      return connections;
    },
    get refused() {
      return refused;
    },
    /** The next `n` connections get a 503 `unavailable` with `Retry-After: 1`. */
    refuseNext(n) {
      refuse = n;
    },
    cut() {
      for (const s of open) s.destroy();
      open.clear();
    },
    close() {
      this.cut();
      return new Promise((r) => server.close(r));
    },
  };
}
