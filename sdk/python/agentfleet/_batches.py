"""Submitting a batch from an iterable: sent in chunks, one ``POST /v1/batches`` each, whose
``Idempotency-Key`` is a hash of that very request body (and an optional label) with the
chunk's range, as ``agentfleetctl submit`` makes them. Submitting the same items again (after a
crash or a time-out) finds the batches already made (200) and creates nothing twice; another
``label`` makes new runs."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# The API's `custom_id` bound.
MAX_CUSTOM_ID_CHARS = 128


@dataclass
class Chunk:
    first: int  # 0-based index of the chunk's first item
    body: dict
    key: str

    @property
    def size(self) -> int:
        return len(self.body["runs"])


@dataclass
class BatchSubmission:
    """What ``batches.create`` sent: one batch per chunk, in order."""

    batches: list = field(default_factory=list)
    #: Whether each batch was created now (False: an earlier submission had made it).
    created: list = field(default_factory=list)
    total: int = 0

    @property
    def ids(self) -> list:
        return [str(b.id) for b in self.batches]

    def add(self, response: Any, size: int) -> None:
        """One chunk's answer: 202 made the batch now, 200 found it made by an earlier submission."""
        self.batches.append(response.parsed)
        self.created.append(response.status_code == 202)
        self.total += size


def _item(index: int, item: Any) -> dict:
    if hasattr(item, "to_dict"):
        item = item.to_dict()
    if not isinstance(item, Mapping):
        raise TypeError(f"batch item {index}: expected a mapping (a run's body), got {type(item).__name__}")
    run = dict(item)
    custom_id = run.setdefault("custom_id", f"item-{index + 1}")
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID_CHARS:
        raise ValueError(f"batch item {index}: custom_id must be a string of 1 to {MAX_CUSTOM_ID_CHARS} characters")
    return run


def idempotency_key(body: dict, label: str | None, first: int, last: int) -> str:
    h = hashlib.sha256()
    if label is not None:
        h.update(label.encode())
    h.update(b"\0")
    h.update(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
    return f"agentfleet-py-{h.hexdigest()[:40]}-{first + 1}-{last + 1}"


def chunks(items: Iterable[Any], chunk_size: int, metadata: dict | None, label: str | None) -> Iterator[Chunk]:
    """The chunks of ``items``, read lazily: at most one chunk is held at a time."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    it = iter(items)
    first = 0
    while True:
        runs = [_item(first + i, item) for i, item in enumerate(itertools.islice(it, chunk_size))]
        if not runs:
            return
        body: dict = {"runs": runs}
        if metadata is not None:
            body["metadata"] = metadata
        yield Chunk(first, body, idempotency_key(body, label, first, first + len(runs) - 1))
        first += len(runs)
