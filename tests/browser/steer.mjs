// Steering runs from the console in headless Chromium: answer a question, reject a call with a
// reason, cancel a run. Environment: CONSOLE_URL, CONSOLE_KEY, and CONSOLE_RUNS, a JSON object
// of `POST /v1/runs` bodies: `ask` (asks a question), `risky` (calls a risky tool), `slow` (a
// model that takes long). Prints what the page showed (tests/tests/e2e/console.rs checks it).

import { drive, env, signIn, startRun } from "./lib.mjs";

const base = env("CONSOLE_URL");
const key = env("CONSOLE_KEY");
const bodies = JSON.parse(env("CONSOLE_RUNS"));

await drive(async (page, out) => {
  await signIn(page, base, key);
  const ids = {};
  for (const name of ["ask", "risky", "slow"]) ids[name] = await startRun(page, base, key, bodies[name]);
  out.runs = ids;

  // A question, answered in place; the answer shows as the user's message.
  await page.goto(`${base}/console/#/runs/${ids.ask}`);
  await page.waitForSelector("#answer", { state: "visible" });
  out.question = await page.textContent("#pending .question");
  await page.fill("#answer", "Paris, please");
  await page.click("#send-answer");
  await page.waitForSelector('#run-status[data-status="completed"]');
  await page.waitForFunction(() => [...document.querySelectorAll(".msg.user .text")].some((t) => t.textContent === "Paris, please"));
  out.askPendingHidden = await page.$eval("#pending", (p) => p.hidden);

  // A risky call, rejected with a reason: the call's card says so.
  await page.goto(`${base}/console/#/runs/${ids.risky}`);
  await page.waitForSelector("#send-decisions", { state: "visible" });
  const decision = page.locator("fieldset.decision").first();
  await decision.locator('input[value="reject"]').check();
  await decision.locator("input.reason").fill("not on a Friday");
  await page.click("#send-decisions");
  await page.waitForSelector('#run-status[data-status="completed"]');
  await page.waitForSelector(".tool.rejected");
  out.rejection = await page.textContent(".tool.rejected .result");

  // A run that is still going, cancelled from its page.
  await page.goto(`${base}/console/#/runs/${ids.slow}`);
  await page.waitForSelector("#cancel", { state: "visible" });
  await page.click("#cancel");
  await page.waitForSelector('#run-status[data-status="cancelled"]');
  await page.waitForSelector('#stream-state[data-state="ended"]');
  out.cancelledNote = await page.textContent(".note.end.bad");
});
