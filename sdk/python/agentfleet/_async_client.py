"""The asyncio client: ``AsyncClient(api_key=..., base_url=...)``; every call is awaited,
``runs.stream``, ``runs.iter``, ``threads.iter_messages`` and ``batches.results`` are async
iterators."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

import httpx

from . import _common as c
from ._batches import BatchSubmission, chunks
from ._errors import APIError
from ._generated.api.batches import submit_batch
from ._generated.api.runs import resume_run
from ._generated.client import AuthenticatedClient
from ._resources import BatchesBase, ClientBase, RunsBase, ThreadsBase
from ._retry import AsyncRetryTransport, RetryPolicy
from ._sse import LineSplitter, SSEDecoder
from ._streams import RunEvent, RunStream, ThreadStream


class AsyncClient(ClientBase):
    """As :class:`Client`, for asyncio."""

    def _new_http(self, options: dict, policy: RetryPolicy) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            **options,
            transport=AsyncRetryTransport(httpx.AsyncHTTPTransport(), policy),
            event_hooks={"response": [c.araise_for_status]},
        )

    def _attach(self, generated: AuthenticatedClient) -> AuthenticatedClient:
        return generated.set_async_httpx_client(self._http)

    async def _call(self, operation: Any, *args: Any, **kwargs: Any) -> Any:
        return (await self._detailed(operation, *args, **kwargs)).parsed

    async def _detailed(self, operation: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await operation.asyncio_detailed(*args, client=self._gen, **kwargs)
        except httpx.TransportError as e:
            raise c.connection_error(e) from e

    async def _lines(self, path: str, params: Mapping) -> AsyncIterator[Any]:
        try:
            async with self._http.stream("GET", path, params=params, timeout=c.streaming_timeout(self._http)) as r:
                splitter = LineSplitter(self.max_event_chars)
                async for chunk in r.aiter_text():
                    for line in splitter.feed(chunk):
                        if line.strip():
                            yield json.loads(line)
                rest = splitter.rest()
                if rest.strip():
                    yield json.loads(rest)
        except httpx.TransportError as e:
            raise c.connection_error(e) from e

    async def _follow(self, state: RunStream) -> AsyncIterator[RunEvent]:
        """The events of a stream, reconnecting as ``state`` says."""
        timeout = c.streaming_timeout(self._http, self.stream_idle_timeout)
        while not state.done:
            try:
                async with self._http.stream("GET", state.path, headers=state.headers(), timeout=timeout) as response:
                    decoder = SSEDecoder(self.max_event_chars)
                    async for chunk in response.aiter_text():
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
            await asyncio.sleep(wait)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncRuns(RunsBase):
    async def iter(
        self,
        *,
        status: str | None = None,
        thread_id: str | None = None,
        batch_id: str | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[Any]:
        """Every matching run, newest first, page after page."""
        cursor = None
        while True:
            page = await self.list(
                status=status, thread_id=thread_id, batch_id=batch_id, limit=page_size, cursor=cursor
            )
            for run in page.data:
                yield run
            cursor = c.next_cursor(page)
            if cursor is None:
                return

    async def approve(
        self, run_id: str, tool_call_ids: Sequence[str] | None = None, *, reason: str | None = None
    ) -> Any:
        """Approves the given tool calls, or every call the run waits for -> ``Run``."""
        return await self.decide(run_id, True, tool_call_ids, reason)

    async def reject(
        self, run_id: str, tool_call_ids: Sequence[str] | None = None, *, reason: str | None = None
    ) -> Any:
        """Rejects the given tool calls, or every call the run waits for; the model is told ``reason``."""
        return await self.decide(run_id, False, tool_call_ids, reason)

    async def decide(
        self, run_id: str, approve: bool, tool_call_ids: Sequence[str] | None = None, reason: str | None = None
    ) -> Any:
        ids = list(tool_call_ids) if tool_call_ids is not None else c.pending_call_ids(await self.get(run_id))
        return await self._c._call(resume_run, run_id, body=c.decisions_body(ids, approve, reason))

    def stream(
        self, run_id: str, *, after: int = 0, stop_at_pause: bool = False, max_reconnects: int = 10
    ) -> AsyncIterator[RunEvent]:
        """As :meth:`Client.runs.stream`: every event exactly once, in order, across reconnections."""
        return self._c._follow(RunStream(str(run_id), after, stop_at_pause, max_reconnects))


class AsyncBatches(BatchesBase):
    async def create(
        self,
        items: Iterable[Any],
        *,
        chunk_size: int = 1000,
        metadata: Mapping | None = None,
        label: str | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> BatchSubmission:
        """As :meth:`Client.batches.create`."""
        out = BatchSubmission()
        for chunk in chunks(items, chunk_size, c.mapping_or_none(metadata), label):
            response = await self._c._detailed(submit_batch, body=c.submit_body(chunk.body), idempotency_key=chunk.key)
            out.add(response, chunk.size)
            if on_progress:
                on_progress(out.total)
        return out

    async def wait(
        self,
        batch_ids: Iterable[str],
        *,
        poll_interval: float = 1.0,
        timeout: float | None = None,
        on_progress: Callable[[list], None] | None = None,
    ) -> list:
        """As :meth:`Client.batches.wait`."""
        ids = [str(b) for b in batch_ids]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            batches = [await self.get(i) for i in ids]
            if on_progress:
                on_progress(batches)
            if all(c.batch_finished(b) for b in batches):
                return batches
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"batches not finished within {timeout}s")
            await asyncio.sleep(poll_interval)


class AsyncThreads(ThreadsBase):
    def stream(
        self, thread_id: str, *, last_event_id: str | None = None, max_reconnects: int = 10
    ) -> AsyncIterator[RunEvent]:
        """As :meth:`Client.threads.stream`."""
        return self._c._follow(ThreadStream(str(thread_id), last_event_id, max_reconnects))

    async def iter_messages(self, thread_id: str, *, page_size: int | None = None) -> AsyncIterator[Any]:
        """Every message of the thread, oldest first, page after page."""
        after = None
        while True:
            page = await self.messages(thread_id, after=after, limit=page_size)
            for message in page.data:
                yield message
            after = c.next_after(page)
            if after is None:
                return


AsyncClient._runs, AsyncClient._batches, AsyncClient._threads = AsyncRuns, AsyncBatches, AsyncThreads
