"""The calls that are one request each, shared by :class:`Client` (which returns values) and
:class:`AsyncClient` (which returns awaitables of the same values): each delegates to the
client's ``_call``, which runs the generated operation."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from . import _common as c
from ._generated.api.batches import cancel_batch, get_batch, list_batches
from ._generated.api.events import issue_stream_token
from ._generated.api.runs import cancel_run, count_runs, create_batch, create_run, get_run, list_runs, resume_run
from ._generated.api.threads import list_messages
from ._generated.api.usage import get_usage
from ._generated.api.webhooks import (
    create_webhook,
    delete_webhook,
    get_webhook,
    list_webhook_deliveries,
    list_webhooks,
    retry_webhook_delivery,
    rotate_webhook_secret,
)
from ._generated.client import AuthenticatedClient
from ._generated.models import ResumeRequest
from ._retry import RetryPolicy
from ._sse import DEFAULT_MAX_EVENT_CHARS
from ._webhooks import verify_webhook


class ClientBase:
    """The settings and resources both clients have; a subclass says how it makes its HTTP
    client (``_new_http``) and which resource classes run its control flow."""

    _runs: type
    _batches: type
    _threads: type

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 2,
        webhook_secret: str | None = None,
        stream_idle_timeout: float = c.DEFAULT_STREAM_IDLE_TIMEOUT,
        max_event_chars: int = DEFAULT_MAX_EVENT_CHARS,
    ):
        key, url = c.settings(api_key, base_url)
        self.base_url = url
        self.stream_idle_timeout = stream_idle_timeout
        #: A streamed event (or a line of batch results) longer than this is a ``StreamError``.
        self.max_event_chars = max_event_chars
        self._http = self._new_http(c.http_options(key, url, timeout), RetryPolicy(retries=max_retries))
        self._gen = self._attach(AuthenticatedClient(base_url=url, token=key))
        self.runs = self._runs(self)
        self.batches = self._batches(self)
        self.threads = self._threads(self)
        self.webhooks = WebhooksBase(self, webhook_secret)
        self.usage = UsageBase(self)

    def _new_http(self, options: dict, policy: RetryPolicy) -> Any:
        raise NotImplementedError

    def _attach(self, generated: AuthenticatedClient) -> AuthenticatedClient:
        raise NotImplementedError


class RunsBase:
    def __init__(self, client: Any):
        self._c = client

    def create(
        self,
        input: str,
        *,
        agent: Any,
        thread_id: str | None = None,
        metadata: Mapping | None = None,
        if_busy: str | None = None,
        idempotency_key: str | None = None,
    ):
        """Starts a run (202) -> ``Run``. With ``idempotency_key`` a retry answers the same run."""
        body = c.create_run_body(input, agent, thread_id, metadata, if_busy)
        return self._c._call(create_run, body=body, idempotency_key=c.opt(idempotency_key))

    def create_many(self, runs: Iterable[Any]):
        """``POST /v1/runs/batch``: up to ``api.max_batch_runs`` runs, all or nothing -> ``BatchCreated``."""
        return self._c._call(create_batch, body=c.create_many_body(runs))

    def get(self, run_id: str):
        """-> ``Run`` (with ``pending`` while it waits)."""
        return self._c._call(get_run, run_id)

    def list(
        self,
        *,
        status: str | None = None,
        thread_id: str | None = None,
        batch_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ):
        """A page of runs, newest first -> ``RunPage`` (``.data``, ``.next_cursor``)."""
        return self._c._call(
            list_runs,
            status=c.run_status(status),
            thread_id=c.opt(thread_id),
            batch_id=c.opt(batch_id),
            limit=c.opt(limit),
            cursor=c.opt(cursor),
        )

    def counts(self, *, thread_id: str | None = None, batch_id: str | None = None):
        """-> ``RunCounts``."""
        return self._c._call(count_runs, thread_id=c.opt(thread_id), batch_id=c.opt(batch_id))

    def cancel(self, run_id: str):
        """-> ``Run``. Repeating it on a cancelled run changes nothing."""
        return self._c._call(cancel_run, run_id)

    def answer(self, run_id: str, input: str):
        """Answers the run's question (``input_required``) -> ``Run``."""
        return self._c._call(resume_run, run_id, body=c.answer_body(input))

    def resume(self, run_id: str, body: Any):
        """The raw ``POST /v1/runs/{id}/resume``: ``{"input"}`` or ``{"decisions": [...]}`` -> ``Run``."""
        return self._c._call(resume_run, run_id, body=ResumeRequest.from_dict(c.to_dict(body)))

    def stream_token(self, run_id: str):
        """A token for a browser's ``EventSource`` -> ``StreamToken`` (``.url``)."""
        return self._c._call(issue_stream_token, run_id)


class BatchesBase:
    def __init__(self, client: Any):
        self._c = client

    def get(self, batch_id: str):
        """-> ``Batch`` (status, counts per status, usage)."""
        return self._c._call(get_batch, batch_id)

    def list(self, *, limit: int | None = None, before: str | None = None):
        """-> ``BatchPage``, newest first."""
        return self._c._call(list_batches, limit=c.opt(limit), before=c.opt(before))

    def cancel(self, batch_id: str):
        """-> ``Batch``. Nothing more is created; runs not yet ended are cancelled."""
        return self._c._call(cancel_batch, batch_id)

    def results(self, batch_id: str, *, finished_only: bool = False):
        """One dict per item in submission order: ``custom_id``, ``run_id``, ``status``, ``output``, ``error``."""
        return self._c._lines(f"/v1/batches/{batch_id}/results", c.results_params(finished_only))


class ThreadsBase:
    def __init__(self, client: Any):
        self._c = client

    def messages(self, thread_id: str, *, after: int | None = None, limit: int | None = None):
        """A page of the thread's messages, oldest first -> ``MessagePage`` (``.data``, ``.next_after``)."""
        return self._c._call(list_messages, thread_id, after=c.opt(after), limit=c.opt(limit))

    def runs(self, thread_id: str):
        """The thread's runs, newest first."""
        return self._c.runs.iter(thread_id=thread_id)


class WebhooksBase:
    def __init__(self, client: Any, secret: str | None):
        self._c = client
        self._secret = secret

    def create(self, url: str, events: Iterable[str], *, description: str | None = None, secret: str | None = None):
        """Registers an endpoint -> ``WebhookCreated``; its ``secret`` is shown only this once."""
        return self._c._call(create_webhook, body=c.webhook_body(url, events, description, secret))

    def list(self):
        return self._c._call(list_webhooks)

    def get(self, webhook_id: str):
        return self._c._call(get_webhook, webhook_id)

    def delete(self, webhook_id: str):
        return self._c._call(delete_webhook, webhook_id)

    def deliveries(self, webhook_id: str, *, limit: int | None = None, cursor: str | None = None):
        """-> ``DeliveryPage``, newest first."""
        return self._c._call(list_webhook_deliveries, webhook_id, limit=c.opt(limit), cursor=c.opt(cursor))

    def retry_delivery(self, webhook_id: str, delivery_id: str):
        return self._c._call(retry_webhook_delivery, webhook_id, delivery_id)

    def rotate_secret(self, webhook_id: str, *, secret: str | None = None):
        return self._c._call(rotate_webhook_secret, webhook_id, body=c.rotate_body(secret))

    def verify(self, headers: Mapping[str, str], body: Any, *, secret: str | None = None) -> Any:
        """The delivery's JSON if it is signed with ``secret`` (or the client's ``webhook_secret``);
        raises :class:`WebhookVerificationError` otherwise. Pass the body exactly as received."""
        key = secret or self._secret
        if not key:
            raise ValueError("no webhook secret: pass secret= or webhook_secret= to the client")
        return verify_webhook(key, headers, body)


class UsageBase:
    def __init__(self, client: Any):
        self._c = client

    def get(self, *, start: Any = None, end: Any = None):
        """The tenant's usage per UTC day, ``start`` to ``end`` (dates or ``YYYY-MM-DD``; the
        last 30 days by default) -> ``UsageReport``."""
        return self._c._call(get_usage, from_=c.day(start), to=c.day(end))
