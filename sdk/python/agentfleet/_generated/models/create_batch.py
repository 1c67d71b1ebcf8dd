from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.create_run import CreateRun


T = TypeVar("T", bound="CreateBatch")


@_attrs_define
class CreateBatch:
    """
    Attributes:
        runs (list[CreateRun]): At least one run, at most the tenant's `max_batch_size` (and `api.max_batch_runs`);
            `if_busy` is `reject` here
    """

    runs: list[CreateRun]

    def to_dict(self) -> dict[str, Any]:
        runs = []
        for runs_item_data in self.runs:
            runs_item = runs_item_data.to_dict()
            runs.append(runs_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "runs": runs,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.create_run import CreateRun

        d = dict(src_dict)
        runs = []
        _runs = d.pop("runs")
        for runs_item_data in _runs:
            runs_item = CreateRun.from_dict(runs_item_data)

            runs.append(runs_item)

        create_batch = cls(
            runs=runs,
        )

        return create_batch
