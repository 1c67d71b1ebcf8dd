"""What the blocking and the asyncio clients share: settings, the HTTP client's options,
request bodies, and turning answers into values or typed errors."""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx

from ._errors import APIConnectionError, error_from_response
from ._generated.models import (
    CreateBatch,
    CreateRun,
    CreateWebhook,
    CreateWebhookEventsItem,
    DecisionBody,
    ResumeRequest,
    RotateSecret,
    RunStatus,
    SubmitBatch,
)
from ._generated.types import UNSET
from ._version import __version__

DEFAULT_BASE_URL = "http://127.0.0.1:8080"
# An event stream is idle at most `events.keepalive_secs` (15 s by default) between keep-alives.
DEFAULT_STREAM_IDLE_TIMEOUT = 60.0


def settings(api_key: str | None, base_url: str | None) -> tuple:
    key = api_key or os.environ.get("AGENTFLEET_API_KEY")
    if not key:
        raise ValueError("no API key: pass api_key= or set AGENTFLEET_API_KEY")
    url = (base_url or os.environ.get("AGENTFLEET_API_URL") or DEFAULT_BASE_URL).rstrip("/")
    return key, url


def http_options(key: str, base_url: str, timeout: float) -> dict:
    return {
        "base_url": base_url,
        "headers": {"Authorization": f"Bearer {key}", "User-Agent": f"agentfleet-python/{__version__}"},
        "timeout": httpx.Timeout(timeout),
        "follow_redirects": False,
    }


def raise_for_status(response: httpx.Response) -> None:
    """The blocking client's response hook: a refusal becomes a typed error."""
    if response.status_code >= 400:
        response.read()
        raise error_from_response(response.status_code, response.headers, response.content)


async def araise_for_status(response: httpx.Response) -> None:
    if response.status_code >= 400:
        await response.aread()
        raise error_from_response(response.status_code, response.headers, response.content)


def connection_error(e: httpx.TransportError) -> APIConnectionError:
    return APIConnectionError(f"{type(e).__name__}: {e}")


def opt(value: Any) -> Any:
    return UNSET if value is None else value


def to_dict(value: Any) -> Any:
    return value.to_dict() if hasattr(value, "to_dict") else value


def create_run_body(
    input: str, agent: Any, thread_id: str | None, metadata: Mapping | None, if_busy: str | None
) -> CreateRun:
    body: dict = {"input": input, "agent": to_dict(agent)}
    if thread_id is not None:
        body["thread_id"] = str(thread_id)
    if metadata is not None:
        body["metadata"] = dict(metadata)
    if if_busy is not None:
        body["if_busy"] = str(if_busy)
    return CreateRun.from_dict(body)


def create_many_body(runs: Iterable[Any]) -> CreateBatch:
    return CreateBatch.from_dict({"runs": [to_dict(r) for r in runs]})


def submit_body(body: dict) -> SubmitBatch:
    return SubmitBatch.from_dict(body)


def answer_body(text: str) -> ResumeRequest:
    return ResumeRequest(input_=text)


def decisions_body(ids: Sequence[str], approve: bool, reason: str | None) -> ResumeRequest:
    return ResumeRequest(decisions=[DecisionBody(approve=approve, tool_call_id=i, reason=opt(reason)) for i in ids])


def pending_call_ids(run: Any) -> list:
    """The tool calls a run waits for a decision on (none unless it waits for confirmation)."""
    pending = getattr(run, "pending", None)
    doc = to_dict(pending) if pending not in (None, UNSET) else {}
    if not isinstance(doc, Mapping) or doc.get("kind") != "confirmation":
        return []
    return [c["tool_call_id"] for c in doc.get("tool_calls", [])]


def run_status(status: str | RunStatus | None) -> Any:
    return UNSET if status is None else RunStatus(status)


def day(value: str | datetime.date | None) -> Any:
    if value is None:
        return UNSET
    return value if isinstance(value, datetime.date) else datetime.date.fromisoformat(value)


def webhook_body(url: str, events: Iterable[str], description: str | None, secret: str | None) -> CreateWebhook:
    return CreateWebhook(
        url=url, events=[CreateWebhookEventsItem(e) for e in events], description=opt(description), secret=opt(secret)
    )


def rotate_body(secret: str | None) -> RotateSecret:
    return RotateSecret(secret=opt(secret))


def results_params(finished_only: bool) -> dict:
    return {"status": "finished"} if finished_only else {}


def batch_finished(batch: Any) -> bool:
    status = getattr(batch.status, "value", batch.status)
    return status in ("completed", "cancelled")


def streaming_timeout(http: Any, idle: float | None = None) -> httpx.Timeout:
    """The client's connect time-out, and ``idle`` (None: no bound) between two reads."""
    return httpx.Timeout(http.timeout.connect, read=idle, write=http.timeout.write, pool=http.timeout.pool)


def next_cursor(page: Any) -> str | None:
    value = getattr(page, "next_cursor", None)
    return value if isinstance(value, str) and value else None


def next_after(page: Any) -> int | None:
    value = getattr(page, "next_after", None)
    return value if isinstance(value, int) else None


def mapping_or_none(value: Mapping | None) -> dict | None:
    return dict(value) if value is not None else None
