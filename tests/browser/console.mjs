// Drives the console in headless Chromium through one scenario, and prints what the page
// showed as one JSON line for the Rust test (tests/tests/e2e/console.rs) to check against the
// API. Every wait has a deadline; a failure prints `{"error": ...}` and exits non-zero.
//
// Environment: CONSOLE_URL (the API's base URL, through the test's cuttable proxy),
// CONSOLE_KEY (an API key), CONSOLE_RUN_BODY (the `POST /v1/runs` body of the run to watch,
// started once the runs list is open), CONSOLE_CUT (POST it to cut every open connection
// between the browser and the API), CHROMIUM (the browser's path), SCREENSHOTS (a directory
// for screenshots; optional).

import { drive, env, signIn, startRun } from "./lib.mjs";

const base = env("CONSOLE_URL");
const key = env("CONSOLE_KEY");
const runBody = JSON.parse(env("CONSOLE_RUN_BODY"));
const cut = env("CONSOLE_CUT");
const shots = process.env.SCREENSHOTS;

await drive(async (page, out) => {
  let runId = null;
  out.eventStreamRequests = 0;
  page.on("request", (r) => {
    if (new URL(r.url()).pathname === `/v1/runs/${runId}/events`) out.eventStreamRequests += 1;
  });
  const cutNow = async () => {
    const res = await fetch(cut, { method: "POST" });
    return Number(await res.text());
  };

  // Sign in: a wrong key is refused, the right one lands on the runs list.
  await page.goto(`${base}/console/`);
  out.csp = (await page.request.get(`${base}/console/`)).headers()["content-security-policy"];
  await page.fill("#api-key", "af_not_a_key");
  await page.click("#sign-in button[type=submit]");
  await page.waitForSelector("#sign-in-error:not(:empty)");
  out.refusedKey = await page.textContent("#sign-in-error");
  await signIn(page, base, key);

  // Start the run while the list is open: the list shows it without a reload.
  runId = await startRun(page, base, key, runBody);
  out.runId = runId;
  await page.waitForSelector(`#runs tr[data-run-id="${runId}"]`);

  // The run page: watch it stream, and cut the connection in the middle of the first reply.
  await page.goto(`${base}/console/#/runs/${runId}`);
  // (The event log is in a closed <details>: attached, not visible.)
  await page.waitForSelector('#event-log li[data-type="message_delta"]', { state: "attached" });
  out.cutsDuringFirstReply = await cutNow();
  await page.waitForSelector("#send-decisions", { state: "visible" });
  if (shots) await page.screenshot({ path: `${shots}/console-approval.png`, fullPage: true });
  // Approve the risky call, with a reason.
  const decision = page.locator("fieldset.decision").first();
  out.pendingCall = await decision.getAttribute("data-call-id");
  await decision.locator('input[value="approve"]').check();
  await decision.locator("input.reason").fill("amount checked by the browser test");
  await page.click("#send-decisions");

  // After the resume: cut again while the second reply streams.
  await page.waitForFunction(() => {
    const items = [...document.querySelectorAll("#event-log li")];
    const resumed = items.findIndex((li) => li.dataset.type === "run_resumed");
    return resumed >= 0 && items.slice(resumed).some((li) => li.dataset.type === "message_delta");
  });
  out.cutsDuringSecondReply = await cutNow();
  await page.waitForSelector('#stream-state[data-state="ended"]');
  await page.waitForSelector('#run-status[data-status="completed"]');
  if (shots) await page.screenshot({ path: `${shots}/console-run.png`, fullPage: true });

  out.events = await page.$$eval("#event-log li", (lis) => lis.map((li) => ({ id: Number(li.dataset.eventId), type: li.dataset.type })));
  out.gap = await page.$eval("#event-log", (el) => el.dataset.gap || null);
  out.replies = await page.$$eval(".msg.assistant", (els) => els.map((el) => ({
    iteration: Number(el.dataset.iteration), streamed: el.dataset.streamed ?? null,
    shown: el.querySelector(".text").textContent,
  })));
  out.tools = await page.$$eval(".tool", (els) => els.map((el) => ({ id: el.dataset.toolCallId, result: el.querySelector(".result").textContent })));
  out.usage = await page.$$eval("#run-usage dd", (dds) => Object.fromEntries(dds.map((dd) => [dd.dataset.usage, dd.textContent])));
  out.cancelHidden = await page.$eval("#cancel", (b) => b.hidden);

  // The thread page lists the run and its messages.
  await page.click("#thread-link");
  await page.waitForSelector(`#thread-runs tr[data-run-id="${runId}"]`);
  await page.waitForSelector("#thread-messages li.msg.tool", { state: "attached" });
  out.threadMessages = await page.$$eval("#thread-messages li", (lis) => lis.map((li) => li.className));
  if (shots) await page.screenshot({ path: `${shots}/console-thread.png`, fullPage: true });

  // Back to the list, filtered by status.
  await page.goto(`${base}/console/#/?status=completed`);
  await page.waitForSelector(`#runs tr[data-run-id="${runId}"]`);
  await page.waitForSelector('#counts .count[data-status="completed"] b:not(:empty)');
  out.completedCount = Number(await page.textContent('#counts .count[data-status="completed"] b'));
  out.listedStatuses = await page.$$eval("#runs tr .badge", (bs) => bs.map((b) => b.textContent));
  if (shots) await page.screenshot({ path: `${shots}/console-runs.png`, fullPage: true });

  // A hostile reply rendered as text: no script ran (the test's model sends one).
  out.injected = await page.evaluate(() => window.__injected === true);
});
