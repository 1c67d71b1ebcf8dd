import assert from "node:assert/strict";
import { test } from "node:test";

import { verifyWebhook, WebhookVerificationError } from "../dist/index.js";
import { client, collect, model, receiver, script, waitFor } from "./helpers.mjs";

test("a real delivery verifies and a tampered one does not", async () => {
  const hooks = await receiver();
  const af = client();
  const hook = await af.webhooks.create({ url: hooks.url("/hook"), events: ["run.completed"], description: "sdk test" });
  assert.match(hook.secret, /^whsec_/);
  try {
    const run = await af.runs.create(script({ content: "done" }), { agent: { model: model() } });
    assert.equal((await collect(af.runs.stream(run.id))).at(-1).type, "run_completed");
    const { headers, body } = await waitFor("the run.completed delivery", 30_000, () =>
      hooks.posts("/hook").find((r) => JSON.parse(r.body).data.run_id === run.id),
    );

    const event = await af.webhooks.verify(headers, body, { secret: hook.secret });
    assert.equal(event.type, "run.completed");
    assert.equal(event.data.status, "completed");
    assert.equal((await verifyWebhook(hook.secret, headers, body.toString())).data.run_id, run.id);

    const tampered = Buffer.from(body.toString().replace('"completed"', '"failed"'));
    assert.notDeepEqual(tampered, body);
    await assert.rejects(af.webhooks.verify(headers, tampered, { secret: hook.secret }), WebhookVerificationError);
    await assert.rejects(
      af.webhooks.verify({ ...headers, "webhook-id": headers["webhook-id"] + "x" }, body, { secret: hook.secret }),
      WebhookVerificationError,
    );
    await assert.rejects(af.webhooks.verify(headers, body, { secret: "whsec_" + "A".repeat(32) }), WebhookVerificationError);

    const deliveries = await af.webhooks.deliveries(hook.id);
    assert.ok(deliveries.data.some((d) => d.event === "run.completed"));
  } finally {
    await af.webhooks.delete(hook.id);
    await hooks.close();
  }
});
