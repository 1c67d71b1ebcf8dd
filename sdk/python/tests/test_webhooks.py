import json

import pytest
from conftest import script, wait_for

from agentfleet import EventType, WebhookVerificationError, verify_webhook


def test_a_real_delivery_verifies_and_a_tampered_one_does_not(client, model, receiver):
    hook = client.webhooks.create(receiver.url("/hook"), ["run.completed"], description="sdk test")
    assert hook.secret.startswith("whsec_")
    try:
        run = client.runs.create(script({"content": "done"}), agent={"model": model})
        assert list(client.runs.stream(run.id))[-1].type == EventType.RUN_COMPLETED

        def delivered():
            for _, headers, body in receiver.posts("/hook"):
                if json.loads(body)["data"]["run_id"] == str(run.id):
                    return headers, body
            return None

        headers, body = wait_for("the run.completed delivery", 30, delivered)
        event = client.webhooks.verify(headers, body, secret=hook.secret)
        assert event["type"] == "run.completed" and event["data"]["status"] == "completed"
        assert verify_webhook(hook.secret, headers, body)["data"]["run_id"] == str(run.id)

        tampered = body.replace(b'"completed"', b'"failed"', 1)
        assert tampered != body
        with pytest.raises(WebhookVerificationError):
            client.webhooks.verify(headers, tampered, secret=hook.secret)
        with pytest.raises(WebhookVerificationError):
            client.webhooks.verify({**headers, "webhook-id": headers["webhook-id"] + "x"}, body, secret=hook.secret)
        with pytest.raises(WebhookVerificationError):
            client.webhooks.verify(headers, body, secret="whsec_" + "A" * 32)

        deliveries = client.webhooks.deliveries(str(hook.id))
        assert any(d.event == "run.completed" for d in deliveries.data)
    finally:
        client.webhooks.delete(str(hook.id))
