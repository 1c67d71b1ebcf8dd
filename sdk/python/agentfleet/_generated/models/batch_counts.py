from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="BatchCounts")


@_attrs_define
class BatchCounts:
    """Items per status: `pending` = no run created yet; the others are the statuses of the
    items' runs (an item that could get no run, its thread busy or gone, counts as `failed`;
    after a cancel, items never created count as `cancelled`; a plan-and-solve run waiting for
    its tasks counts as `running`).

        Attributes:
            cancelled (int):
            completed (int):
            failed (int):
            pending (int):
            queued (int):
            running (int):
            waiting_for_confirmation (int):
            waiting_for_input (int):
    """

    cancelled: int
    completed: int
    failed: int
    pending: int
    queued: int
    running: int
    waiting_for_confirmation: int
    waiting_for_input: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        cancelled = self.cancelled

        completed = self.completed

        failed = self.failed

        pending = self.pending

        queued = self.queued

        running = self.running

        waiting_for_confirmation = self.waiting_for_confirmation

        waiting_for_input = self.waiting_for_input

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "cancelled": cancelled,
                "completed": completed,
                "failed": failed,
                "pending": pending,
                "queued": queued,
                "running": running,
                "waiting_for_confirmation": waiting_for_confirmation,
                "waiting_for_input": waiting_for_input,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        cancelled = d.pop("cancelled")

        completed = d.pop("completed")

        failed = d.pop("failed")

        pending = d.pop("pending")

        queued = d.pop("queued")

        running = d.pop("running")

        waiting_for_confirmation = d.pop("waiting_for_confirmation")

        waiting_for_input = d.pop("waiting_for_input")

        batch_counts = cls(
            cancelled=cancelled,
            completed=completed,
            failed=failed,
            pending=pending,
            queued=queued,
            running=running,
            waiting_for_confirmation=waiting_for_confirmation,
            waiting_for_input=waiting_for_input,
        )

        batch_counts.additional_properties = d
        return batch_counts

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
