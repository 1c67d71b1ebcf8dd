"""Following a run's events (``GET /v1/runs/{id}/events``) across reconnections.

The API replays what comes after ``Last-Event-ID`` and then follows the run live, without gap
or duplicate; it ends a response after a terminal event, and after a pause that is the run's
newest event (then a reconnection waits, with keep-alives, for the resume). So this reconnects
whenever a response ends before the run did, sending the id of the last event it yielded, and
drops any event at or below it: a caller gets every event exactly once, in order, until
``run_completed``, ``run_failed`` or ``run_cancelled``.

The state machine is shared by the blocking and the asyncio clients.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any

from ._errors import APIError, StreamError
from ._generated.models.event_envelope_type import EventEnvelopeType as EventType
from ._sse import SSEMessage

TERMINAL = frozenset({"run_completed", "run_failed", "run_cancelled"})
PAUSES = frozenset({"input_required", "confirmation_required"})


@dataclass(frozen=True)
class RunEvent:
    """One event of a run (docs/events.md): the envelope, ``data`` per ``type``."""

    id: int
    run_id: str
    thread_id: str
    #: An :class:`EventType` (a ``str`` enum), or the plain string of a type newer than this library.
    type: EventType | str
    at: datetime.datetime
    data: Any

    @property
    def is_terminal(self) -> bool:
        return self.type in TERMINAL

    @property
    def is_pause(self) -> bool:
        return self.type in PAUSES

    @classmethod
    def from_json(cls, text: str) -> RunEvent:
        try:
            doc = json.loads(text)
            kind = doc["type"]
            try:
                kind = EventType(kind)
            except ValueError:
                pass
            return cls(
                id=int(doc["id"]),
                run_id=str(doc["run_id"]),
                thread_id=str(doc["thread_id"]),
                type=kind,
                at=datetime.datetime.fromisoformat(doc["at"].replace("Z", "+00:00")),
                data=doc.get("data"),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise StreamError(f"a malformed event: {e}") from e


class RunStream:
    """What to send, what to yield and how long to wait: the reconnection rules."""

    def __init__(self, run_id: str, after: int, stop_at_pause: bool, max_reconnects: int):
        self.path = f"/v1/runs/{run_id}/events"
        self.last_id = after
        self.stop_at_pause = stop_at_pause
        self.max_reconnects = max_reconnects
        self.done = False
        self._failures = 0
        self._retry_ms = 2000
        self._yielded_since_connect = False

    def last_event_id(self) -> str | None:
        return str(self.last_id) if self.last_id else None

    def headers(self) -> dict:
        self._yielded_since_connect = False
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
        last = self.last_event_id()
        if last:
            headers["Last-Event-ID"] = last
        return headers

    def retry_hint(self, retry_ms: int | None) -> None:
        if retry_ms is not None:
            self._retry_ms = retry_ms

    def accept(self, message: SSEMessage) -> RunEvent | None:
        """The event to yield, or None (a duplicate, or not an event)."""
        if not message.data:
            return None
        event = RunEvent.from_json(message.data)
        if event.id <= self.last_id:
            return None
        self.last_id = event.id
        self._accepted()
        if event.is_terminal or (self.stop_at_pause and event.is_pause):
            self.done = True
        return event

    def _accepted(self) -> None:
        self._failures = 0
        self._yielded_since_connect = True

    def after_end(self) -> float:
        """Seconds to wait before reconnecting once a response ended before the run did."""
        if self._yielded_since_connect:
            # The run paused: the next response waits for its resume.
            return 0.0
        return self._failed(None)

    @staticmethod
    def resumable(error: APIError) -> bool:
        """Whether a refused reconnection is worth another (the API is restarting or busy)."""
        return error.status >= 500 or error.status == 429

    def after_error(self, error: BaseException) -> float:
        return self._failed(error)

    def _failed(self, error: BaseException | None) -> float:
        self._failures += 1
        if self._failures > self.max_reconnects:
            why = f": {error}" if error else ": responses ended without events"
            raise StreamError(f"{self.path}: gave up after {self.max_reconnects} reconnections{why}") from error
        if self._failures == 1:
            return 0.0  # a cut connection: at once
        # Then the server's hint, approached by doubling.
        return min(self._retry_ms / 1000.0, 0.25 * 2 ** (self._failures - 2))


class ThreadStream(RunStream):
    """A thread's runs one after another (``GET /v1/threads/{id}/events``): SSE ids are
    ``<run_id>:<event id>``, and the stream stays open for the thread's next run until the
    caller stops."""

    def __init__(self, thread_id: str, last_event_id: str | None, max_reconnects: int):
        super().__init__("", 0, False, max_reconnects)
        self.path = f"/v1/threads/{thread_id}/events"
        self._run: str | None = None
        if last_event_id:
            run, _, n = last_event_id.rpartition(":")
            if not run or not n.isdigit():
                raise ValueError("last_event_id must be `<run_id>:<event id>`, as a thread stream's events give it")
            self._run, self.last_id = run, int(n)

    def last_event_id(self) -> str | None:
        return f"{self._run}:{self.last_id}" if self._run else None

    def accept(self, message: SSEMessage) -> RunEvent | None:
        if not message.data:
            return None
        event = RunEvent.from_json(message.data)
        if event.run_id == self._run and event.id <= self.last_id:
            return None
        self._run, self.last_id = event.run_id, event.id
        self._accepted()
        return event
