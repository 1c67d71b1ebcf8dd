"""The blocking client: ``Client(api_key=..., base_url=...)``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import httpx

from . import _common as c
from ._batches import BatchSubmission, chunks
from ._errors import APIError
from ._generated.api.batches import submit_batch
from ._generated.api.runs import resume_run
from ._generated.client import AuthenticatedClient
from ._resources import BatchesBase, ClientBase, RunsBase, ThreadsBase
from ._retry import RetryPolicy, RetryTransport
from ._sse import LineSplitter, SSEDecoder
from ._streams import RunEvent, RunStream, ThreadStream


class Client(ClientBase):
    """A tenant's view of the API. Calls raise :class:`APIError` subclasses on refusals and
    :class:`APIConnectionError` when no answer came; safe calls are retried (``max_retries``
    times, honouring ``Retry-After``).

    ``Client(api_key=None, base_url=None, *, timeout=30.0, max_retries=2, webhook_secret=None,
    stream_idle_timeout=60.0, max_event_chars=16 MiB)``: the key and address default to ``AGENTFLEET_API_KEY`` and
    ``AGENTFLEET_API_URL`` (else ``http://127.0.0.1:8080``)."""

    def _new_http(self, options: dict, policy: RetryPolicy) -> httpx.Client:
        return httpx.Client(
            **options,
            transport=RetryTransport(httpx.HTTPTransport(), policy),
            event_hooks={"response": [c.raise_for_status]},
        )

    def _attach(self, generated: AuthenticatedClient) -> AuthenticatedClient:
        return generated.set_httpx_client(self._http)

    def _call(self, operation: Any, *args: Any, **kwargs: Any) -> Any:
        return self._detailed(operation, *args, **kwargs).parsed

    def _detailed(self, operation: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return operation.sync_detailed(*args, client=self._gen, **kwargs)
        except httpx.TransportError as e:
            raise c.connection_error(e) from e

    def _lines(self, path: str, params: Mapping) -> Iterator[Any]:
        try:
            with self._http.stream("GET", path, params=params, timeout=c.streaming_timeout(self._http)) as r:
                splitter = LineSplitter(self.max_event_chars)
                for chunk in r.iter_text():
                    for line in splitter.feed(chunk):
                        if line.strip():
                            yield json.loads(line)
                rest = splitter.rest()
                if rest.strip():
                    yield json.loads(rest)
        except httpx.TransportError as e:
            raise c.connection_error(e) from e

    def _follow(self, state: RunStream) -> Iterator[RunEvent]:
        """The events of a stream, reconnecting as ``state`` says."""
        timeout = c.streaming_timeout(self._http, self.stream_idle_timeout)
        while not state.done:
            try:
                with self._http.stream("GET", state.path, headers=state.headers(), timeout=timeout) as response:
                    decoder = SSEDecoder(self.max_event_chars)
                    for chunk in response.iter_text():
                        for message in decoder.feed(chunk):
                            state.retry_hint(decoder.retry_ms)
                            event = state.accept(message)
                            if event is not None:
                                yield event
                                if state.done:
                                    return
                wait = state.after_end()
            except httpx.TransportError as e:
                wait = state.after_error(e)
            except APIError as e:
                # A replica restarting or overloaded (5xx, 429): the stream is resumed like a cut one.
                if not state.resumable(e):
                    raise
                wait = max(state.after_error(e), float(e.retry_after or 0))
            time.sleep(wait)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Runs(RunsBase):
    def iter(
        self,
        *,
        status: str | None = None,
        thread_id: str | None = None,
        batch_id: str | None = None,
        page_size: int | None = None,
    ) -> Iterator[Any]:
        """Every matching run, newest first, page after page."""
        cursor = None
        while True:
            page = self.list(status=status, thread_id=thread_id, batch_id=batch_id, limit=page_size, cursor=cursor)
            yield from page.data
            cursor = c.next_cursor(page)
            if cursor is None:
                return

    def approve(self, run_id: str, tool_call_ids: Sequence[str] | None = None, *, reason: str | None = None) -> Any:
        """Approves the given tool calls, or every call the run waits for -> ``Run``."""
        return self.decide(run_id, True, tool_call_ids, reason)

    def reject(self, run_id: str, tool_call_ids: Sequence[str] | None = None, *, reason: str | None = None) -> Any:
        """Rejects the given tool calls, or every call the run waits for; the model is told ``reason``."""
        return self.decide(run_id, False, tool_call_ids, reason)

    def decide(
        self, run_id: str, approve: bool, tool_call_ids: Sequence[str] | None = None, reason: str | None = None
    ) -> Any:
        ids = list(tool_call_ids) if tool_call_ids is not None else c.pending_call_ids(self.get(run_id))
        return self._c._call(resume_run, run_id, body=c.decisions_body(ids, approve, reason))

    def stream(
        self, run_id: str, *, after: int = 0, stop_at_pause: bool = False, max_reconnects: int = 10
    ) -> Iterator[RunEvent]:
        """Every event of the run after ``after``, exactly once and in order, until it ends (or,
        with ``stop_at_pause``, pauses). A broken connection is resumed with ``Last-Event-ID``;
        at a pause the iterator waits for the resume (answer or decide from the loop)."""
        return self._c._follow(RunStream(str(run_id), after, stop_at_pause, max_reconnects))


class Batches(BatchesBase):
    def create(
        self,
        items: Iterable[Any],
        *,
        chunk_size: int = 1000,
        metadata: Mapping | None = None,
        label: str | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> BatchSubmission:
        """Submits the runs of ``items`` (each a run's body, with an optional ``custom_id``,
        ``item-<n>`` by default), read lazily, as one batch per ``chunk_size`` items, each under
        an idempotency key of its content: submitting the same items again creates nothing
        twice. ``on_progress(submitted)`` is called after each chunk."""
        out = BatchSubmission()
        for chunk in chunks(items, chunk_size, c.mapping_or_none(metadata), label):
            response = self._c._detailed(submit_batch, body=c.submit_body(chunk.body), idempotency_key=chunk.key)
            out.add(response, chunk.size)
            if on_progress:
                on_progress(out.total)
        return out

    def wait(
        self,
        batch_ids: Iterable[str],
        *,
        poll_interval: float = 1.0,
        timeout: float | None = None,
        on_progress: Callable[[list], None] | None = None,
    ) -> list:
        """Polls the batches until each is completed or cancelled; ``on_progress(batches)`` after each look."""
        ids = [str(b) for b in batch_ids]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            batches = [self.get(i) for i in ids]
            if on_progress:
                on_progress(batches)
            if all(c.batch_finished(b) for b in batches):
                return batches
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"batches not finished within {timeout}s")
            time.sleep(poll_interval)


class Threads(ThreadsBase):
    def stream(
        self, thread_id: str, *, last_event_id: str | None = None, max_reconnects: int = 10
    ) -> Iterator[RunEvent]:
        """The events of the thread's runs, one run after another, each exactly once; it stays
        open for the next run until the caller stops. Resume with an event's
        ``f"{event.run_id}:{event.id}"`` as ``last_event_id``."""
        return self._c._follow(ThreadStream(str(thread_id), last_event_id, max_reconnects))

    def iter_messages(self, thread_id: str, *, page_size: int | None = None) -> Iterator[Any]:
        """Every message of the thread, oldest first, page after page."""
        after = None
        while True:
            page = self.messages(thread_id, after=after, limit=page_size)
            yield from page.data
            after = c.next_after(page)
            if after is None:
                return


Client._runs, Client._batches, Client._threads = Runs, Batches, Threads
