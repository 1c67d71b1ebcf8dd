from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.batch_status import BatchStatus
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.batch_counts import BatchCounts
    from ..models.batch_metadata import BatchMetadata
    from ..models.batch_usage import BatchUsage


T = TypeVar("T", bound="Batch")


@_attrs_define
class Batch:
    """A batch: what its items have come to.

    Attributes:
        counts (BatchCounts): Items per status: `pending` = no run created yet; the others are the statuses of the
            items' runs (an item that could get no run, its thread busy or gone, counts as `failed`;
            after a cancel, items never created count as `cancelled`; a plan-and-solve run waiting for
            its tasks counts as `running`).
        created_at (datetime.datetime):
        id (UUID):
        metadata (BatchMetadata):
        status (BatchStatus): `creating` (runs still being created), `in_progress`, `completed` (every run ended),
            `cancelling`, `cancelled` (every run ended after a cancel)
        total (int): Items submitted.
        usage (BatchUsage): What the batch's runs used.
        finished_at (datetime.datetime | None | Unset): When its last run ended (status `completed` or `cancelled`).
        started_at (datetime.datetime | None | Unset): When its first run started.
    """

    counts: BatchCounts
    created_at: datetime.datetime
    id: UUID
    metadata: BatchMetadata
    status: BatchStatus
    total: int
    usage: BatchUsage
    finished_at: datetime.datetime | None | Unset = UNSET
    started_at: datetime.datetime | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        counts = self.counts.to_dict()

        created_at = self.created_at.isoformat()

        id = str(self.id)

        metadata = self.metadata.to_dict()

        status = self.status.value

        total = self.total

        usage = self.usage.to_dict()

        finished_at: None | str | Unset
        if isinstance(self.finished_at, Unset):
            finished_at = UNSET
        elif isinstance(self.finished_at, datetime.datetime):
            finished_at = self.finished_at.isoformat()
        else:
            finished_at = self.finished_at

        started_at: None | str | Unset
        if isinstance(self.started_at, Unset):
            started_at = UNSET
        elif isinstance(self.started_at, datetime.datetime):
            started_at = self.started_at.isoformat()
        else:
            started_at = self.started_at

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "counts": counts,
                "created_at": created_at,
                "id": id,
                "metadata": metadata,
                "status": status,
                "total": total,
                "usage": usage,
            }
        )
        if finished_at is not UNSET:
            field_dict["finished_at"] = finished_at
        if started_at is not UNSET:
            field_dict["started_at"] = started_at

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.batch_counts import BatchCounts
        from ..models.batch_metadata import BatchMetadata
        from ..models.batch_usage import BatchUsage

        d = dict(src_dict)
        counts = BatchCounts.from_dict(d.pop("counts"))

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        id = UUID(d.pop("id"))

        metadata = BatchMetadata.from_dict(d.pop("metadata"))

        status = BatchStatus(d.pop("status"))

        total = d.pop("total")

        usage = BatchUsage.from_dict(d.pop("usage"))

        def _parse_finished_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                finished_at_type_0 = datetime.datetime.fromisoformat(data)

                return finished_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        finished_at = _parse_finished_at(d.pop("finished_at", UNSET))

        def _parse_started_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                started_at_type_0 = datetime.datetime.fromisoformat(data)

                return started_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        started_at = _parse_started_at(d.pop("started_at", UNSET))

        batch = cls(
            counts=counts,
            created_at=created_at,
            id=id,
            metadata=metadata,
            status=status,
            total=total,
            usage=usage,
            finished_at=finished_at,
            started_at=started_at,
        )

        batch.additional_properties = d
        return batch

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
