// The package in a browser: Debian's headless Chromium (as the console's tests drive it) loads
// dist/ as ES modules from a page of this process's own server, which also passes /v1 on to the
// API (the page's origin, so no CORS), and runs a paused run to its end with the key.
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import http from "node:http";
import { dirname, join, normalize } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { chromium } from "playwright-core";

import { apiUrl, key, model, receiver, script } from "./helpers.mjs";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const FILES = {
  "/dist/": join(root, "dist"),
  "/eventsource-parser/": join(root, "node_modules/eventsource-parser/dist"),
};
const PAGE = `<!doctype html><meta charset="utf-8"><title>sdk</title>
<script type="importmap">{"imports": {"eventsource-parser": "/eventsource-parser/index.js"}}</script>
<script type="module">import * as af from "/dist/index.js"; window.af = af;</script>`;

async function pageServer() {
  const api = new URL(apiUrl());
  const server = http.createServer(async (req, res) => {
    if (req.url === "/") {
      res.writeHead(200, { "content-type": "text/html" }).end(PAGE);
      return;
    }
    if (req.url.startsWith("/v1/")) {
      const upstream = http.request({ host: api.hostname, port: api.port, path: req.url, method: req.method, headers: req.headers }, (up) => {
        res.writeHead(up.statusCode, up.headers);
        up.pipe(res);
      });
      upstream.on("error", () => res.destroy());
      req.pipe(upstream);
      return;
    }
    const prefix = Object.keys(FILES).find((p) => req.url.startsWith(p));
    const path = prefix && normalize(join(FILES[prefix], req.url.slice(prefix.length)));
    if (!path || !path.startsWith(FILES[prefix])) return res.writeHead(404).end();
    try {
      res.writeHead(200, { "content-type": "text/javascript" }).end(await readFile(path));
    } catch {
      res.writeHead(404).end();
    }
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${server.address().port}`, close: () => new Promise((r) => server.close(r)) };
}

test("in Chromium: create → stream → answer → approve → completed", async () => {
  const [site, tools] = [await pageServer(), await receiver()];
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    // The machine has no network beyond localhost: keep Chromium from trying.
    args: ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update"],
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(site.url);
    await page.waitForFunction(() => window.af !== undefined, null, { timeout: 30_000 });
    const input = script(
      { content: "Which invoice?", tool_calls: [{ name: "ask", arguments: { text: "Which invoice?" } }] },
      { tool_calls: [{ name: "pay", arguments: { amount: 42 } }] },
      { content: "Paid." },
    );
    const tool = { name: "pay", kind: "http", risk: "high", url: tools.url("/pay"), parameters: { type: "object" } };
    const out = await page.evaluate(
      async ({ baseUrl, apiKey, input, agent }) => {
        const client = new window.af.AgentfleetClient({ apiKey, baseUrl });
        const run = await client.runs.create(input, { agent });
        const events = [];
        for await (const event of client.runs.stream(run.id)) {
          events.push([event.id, event.type]);
          if (event.type === "input_required") await client.runs.answer(run.id, "March");
          if (event.type === "confirmation_required") await client.runs.approve(run.id);
        }
        let notFound;
        await client.runs.get("00000000-0000-4000-8000-000000000000").catch((e) => (notFound = [e.name, e.status, e.code]));
        return { events, status: (await client.runs.get(run.id)).status, notFound };
      },
      { baseUrl: site.url, apiKey: key(), input, agent: { model: model(), tools: [tool] } },
    );
    assert.deepEqual(errors, []);
    assert.deepEqual(out.events.map(([id]) => id), out.events.map((_, i) => i + 1));
    const types = out.events.map(([, type]) => type);
    assert.ok(types.includes("input_required") && types.includes("confirmation_required") && types.includes("tool_completed"), String(types));
    assert.equal(types.at(-1), "run_completed");
    assert.equal(out.status, "completed");
    assert.deepEqual(out.notFound, ["NotFoundError", 404, "not_found"]);
    assert.equal(tools.posts("/pay").length, 1);
  } finally {
    await browser.close();
    await Promise.all([site.close(), tools.close()]);
  }
});
