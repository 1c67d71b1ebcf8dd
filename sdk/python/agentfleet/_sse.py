"""A Server-Sent Events decoder (the WHATWG rules: fields, comments, multi-line data)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SSEMessage:
    event: str
    data: str
    id: str | None


class SSEDecoder:
    """Fed one line at a time (without its end), it returns a message at each blank line."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        #: The last ``retry:`` hint, in milliseconds.
        self.retry_ms: int | None = None

    def feed(self, line: str) -> SSEMessage | None:
        if line == "":
            if not self._data and not self._event:
                self._id = None
                return None
            message = SSEMessage(self._event or "message", "\n".join(self._data), self._id)
            self._data, self._event, self._id = [], "", None
            return message
        if line.startswith(":"):
            return None  # a comment: the keep-alive
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id" and "\0" not in value:
            self._id = value
        elif field == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None
