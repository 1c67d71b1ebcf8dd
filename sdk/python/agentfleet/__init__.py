"""agentfleet: a typed client for the agentfleet HTTP API.

    from agentfleet import Client
    client = Client(api_key="af_…", base_url="http://127.0.0.1:8080")
    run = client.runs.create("Say hello", agent={"model": "gpt"})
    for event in client.runs.stream(run.id):
        print(event.id, event.type, event.data)

The models (``agentfleet.models``) and the low-level operations (``agentfleet._generated.api``)
are generated from the API's OpenAPI document (scripts/sdk-generate); this layer adds retries,
typed errors, resumable event streams, chunked batches and webhook verification.
"""

from ._async_client import AsyncClient
from ._batches import BatchSubmission
from ._client import Client
from ._errors import (
    AgentfleetError,
    APIConnectionError,
    APIError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    StreamError,
    UnprocessableEntityError,
)
from ._generated import models
from ._streams import EventType, RunEvent
from ._version import __version__
from ._webhooks import WebhookVerificationError, verify_webhook

__all__ = [
    "AgentfleetError",
    "APIConnectionError",
    "APIError",
    "AsyncClient",
    "AuthenticationError",
    "BadRequestError",
    "BatchSubmission",
    "Client",
    "ConflictError",
    "EventType",
    "InternalServerError",
    "NotFoundError",
    "PermissionDeniedError",
    "RateLimitError",
    "RunEvent",
    "StreamError",
    "UnprocessableEntityError",
    "WebhookVerificationError",
    "__version__",
    "models",
    "verify_webhook",
]
