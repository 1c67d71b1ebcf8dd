from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.batch_item import BatchItem
    from ..models.json_object import JsonObject


T = TypeVar("T", bound="SubmitBatch")


@_attrs_define
class SubmitBatch:
    """
    Attributes:
        runs (list[BatchItem]): The runs, each the body of `POST /v1/runs` plus its `custom_id` (distinct); at most
            `api.max_batch_items`
        metadata (JsonObject | None | Unset):
    """

    runs: list[BatchItem]
    metadata: JsonObject | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.json_object import JsonObject

        runs = []
        for runs_item_data in self.runs:
            runs_item = runs_item_data.to_dict()
            runs.append(runs_item)

        metadata: dict[str, Any] | None | Unset
        if isinstance(self.metadata, Unset):
            metadata = UNSET
        elif isinstance(self.metadata, JsonObject):
            metadata = self.metadata.to_dict()
        else:
            metadata = self.metadata

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "runs": runs,
            }
        )
        if metadata is not UNSET:
            field_dict["metadata"] = metadata

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.batch_item import BatchItem
        from ..models.json_object import JsonObject

        d = dict(src_dict)
        runs = []
        _runs = d.pop("runs")
        for runs_item_data in _runs:
            runs_item = BatchItem.from_dict(runs_item_data)

            runs.append(runs_item)

        def _parse_metadata(data: object) -> JsonObject | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                metadata_type_1 = JsonObject.from_dict(data)

                return metadata_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(JsonObject | None | Unset, data)

        metadata = _parse_metadata(d.pop("metadata", UNSET))

        submit_batch = cls(
            runs=runs,
            metadata=metadata,
        )

        return submit_batch
