// What the browser scripts share: their environment, Chromium, signing in, and the report
// each prints as its last line (`{"error": ...}` and a non-zero exit when something failed).

import { chromium } from "playwright-core";

export const T = 30_000;

export function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
}

/** Runs `scenario(page, out)` in a fresh headless Chromium and prints `out`. */
export async function drive(scenario) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    // The machine has no network beyond localhost: keep Chromium from trying.
    args: ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  const out = { consoleErrors: [], outsideRequests: [] };
  try {
    const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
    page.setDefaultTimeout(T);
    page.on("console", (m) => { if (m.type() === "error") out.consoleErrors.push(m.text()); });
    const origin = new URL(env("CONSOLE_URL")).origin;
    page.on("request", (r) => {
      const u = new URL(r.url());
      if (u.origin !== origin && u.protocol !== "data:") out.outsideRequests.push(r.url());
    });
    await scenario(page, out);
    console.log(JSON.stringify(out));
  } catch (e) {
    console.log(JSON.stringify({ ...out, error: String((e && e.stack) || e) }));
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
}

export async function signIn(page, base, key) {
  await page.goto(`${base}/console/`);
  await page.fill("#api-key", key);
  await page.click("#sign-in button[type=submit]");
  await page.waitForSelector("#counts .count");
}

/** Starts a run through the API (not the page) and answers its id. */
export async function startRun(page, base, key, body) {
  const res = await page.request.post(`${base}/v1/runs`, {
    headers: { Authorization: `Bearer ${key}` }, data: body,
  });
  if (res.status() !== 202) throw new Error(`POST /v1/runs: ${res.status()} ${await res.text()}`);
  return (await res.json()).id;
}
