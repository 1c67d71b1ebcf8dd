"""Checking a webhook delivery: Standard Webhooks signatures (``webhook-id``,
``webhook-timestamp``, ``webhook-signature``: ``v1,`` + base64 of HMAC-SHA256 over
``{id}.{timestamp}.{body}``, keyed with the endpoint's ``whsec_…`` secret), as the API signs
them. A timestamp more than five minutes away from now is refused (a replay)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import standardwebhooks

from ._errors import AgentfleetError


class WebhookVerificationError(AgentfleetError):
    """The delivery is not signed with the secret (tampered, replayed, or another endpoint's)."""


def verify_webhook(secret: str, headers: Mapping[str, str], body: bytes | str) -> Any:
    """The delivery's JSON (``{"type", "timestamp", "data"}``) if it is signed with ``secret``;
    raises :class:`WebhookVerificationError` otherwise. Pass the body exactly as received."""
    try:
        return standardwebhooks.Webhook(secret).verify(body, dict(headers.items()))
    except (standardwebhooks.webhooks.WebhookVerificationError, ValueError) as e:
        raise WebhookVerificationError(str(e)) from e
