"""A Server-Sent Events decoder (the WHATWG rules: fields, comments, multi-line data, any of
the three line ends), bounded: a line or an event longer than its limit is an error, not
memory without end."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._errors import StreamError

# An event of the API carries at most a message's text or a tool's (bounded) result.
DEFAULT_MAX_EVENT_CHARS = 16 * 1024 * 1024

_EOL = re.compile(r"\r\n|\r|\n")


@dataclass
class SSEMessage:
    event: str
    data: str
    id: str | None


class LineSplitter:
    """Text chunks in, whole lines out (without their ends)."""

    def __init__(self, max_line_chars: int):
        self._pending = ""
        self._limit = max_line_chars

    def feed(self, text: str) -> list[str]:
        data = self._pending + text
        # A trailing CR may be the first half of a CRLF: wait for the next chunk.
        held = data.endswith("\r")
        parts = _EOL.split(data[:-1] if held else data)
        self._pending = parts.pop() + ("\r" if held else "")
        if len(self._pending) > self._limit:
            raise StreamError(f"a line longer than {self._limit} characters")
        return parts

    def rest(self) -> str:
        """What came after the last line end (the last line of a body that ends without one)."""
        rest, self._pending = self._pending.rstrip("\r"), ""
        return rest


class SSEDecoder:
    """Fed text as it arrives, it returns the messages completed by each chunk."""

    def __init__(self, max_event_chars: int = DEFAULT_MAX_EVENT_CHARS) -> None:
        self._lines = LineSplitter(max_event_chars)
        self._limit = max_event_chars
        self._size = 0
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        #: The last ``retry:`` hint, in milliseconds.
        self.retry_ms: int | None = None

    def feed(self, text: str) -> list[SSEMessage]:
        messages = []
        for line in self._lines.feed(text):
            message = self._line(line)
            if message is not None:
                messages.append(message)
        return messages

    def _line(self, line: str) -> SSEMessage | None:
        if line == "":
            if not self._data and not self._event:
                self._id = None
                return None
            message = SSEMessage(self._event or "message", "\n".join(self._data), self._id)
            self._data, self._event, self._id, self._size = [], "", None, 0
            return message
        if line.startswith(":"):
            return None  # a comment: the keep-alive
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._size += len(value) + 1
            if self._size > self._limit:
                raise StreamError(f"an event longer than {self._limit} characters")
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id" and "\0" not in value:
            self._id = value
        elif field == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None
