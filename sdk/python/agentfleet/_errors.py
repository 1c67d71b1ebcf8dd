"""Typed errors: every refusal of the API is ``{"error": {"code", "message"}}`` with a status."""

from __future__ import annotations

import json


class AgentfleetError(Exception):
    """Anything this library raises."""


class APIConnectionError(AgentfleetError):
    """No answer: the API could not be reached, or the connection broke, after the retries."""


class StreamError(AgentfleetError):
    """An event stream could not be resumed (too many failed reconnections, or a malformed event)."""


class APIError(AgentfleetError):
    """The API refused a request: ``status`` is the HTTP status, ``code`` and ``message`` its error."""

    def __init__(self, status: int, code: str, message: str, retry_after: int | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        #: Seconds the API asked to wait (``Retry-After``), on 429 and 503.
        self.retry_after = retry_after


class BadRequestError(APIError):
    """400: the body is not JSON."""


class AuthenticationError(APIError):
    """401: no valid key."""


class PermissionDeniedError(APIError):
    """403: e.g. ``tenant_suspended``."""


class NotFoundError(APIError):
    """404: no such resource for this key's tenant."""


class ConflictError(APIError):
    """409: e.g. ``thread_busy``, ``idempotency_key_reused``, a run that is not waiting."""


class UnprocessableEntityError(APIError):
    """422: ``invalid_request``; the message names the field."""


class RateLimitError(APIError):
    """429: ``rate_limited``, ``too_many_active_runs``, ``thread_queue_full``."""


class InternalServerError(APIError):
    """5xx."""


_BY_STATUS = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    422: UnprocessableEntityError,
    429: RateLimitError,
}

# A refusal is a short document; more is not one.
_MAX_MESSAGE_CHARS = 500


def retry_after_seconds(headers) -> int | None:
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0, int(value.strip()))
    except ValueError:
        return None


def error_from_response(status: int, headers, body: bytes) -> APIError:
    """The typed error of a refused answer (a stand-in code ``http_<status>`` when it has none)."""
    code, message = f"http_{status}", ""
    try:
        doc = json.loads(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            if isinstance(err.get("code"), str):
                code = err["code"]
            if isinstance(err.get("message"), str):
                message = err["message"][:_MAX_MESSAGE_CHARS]
    except ValueError:
        pass
    if not message:
        message = body[:_MAX_MESSAGE_CHARS].decode("utf-8", "replace") or f"HTTP {status}"
    cls = _BY_STATUS.get(status) or (InternalServerError if status >= 500 else APIError)
    return cls(status, code, message, retry_after_seconds(headers))
