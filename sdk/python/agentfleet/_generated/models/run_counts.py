from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.run_counts_counts import RunCountsCounts


T = TypeVar("T", bound="RunCounts")


@_attrs_define
class RunCounts:
    """Runs per status (every status present, 0 when none) among the newest `window` runs that
    match; `counted` = `window` means older runs exist that were not counted.

        Attributes:
            counted (int):
            counts (RunCountsCounts):
            window (int):
    """

    counted: int
    counts: RunCountsCounts
    window: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        counted = self.counted

        counts = self.counts.to_dict()

        window = self.window

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "counted": counted,
                "counts": counts,
                "window": window,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.run_counts_counts import RunCountsCounts

        d = dict(src_dict)
        counted = d.pop("counted")

        counts = RunCountsCounts.from_dict(d.pop("counts"))

        window = d.pop("window")

        run_counts = cls(
            counted=counted,
            counts=counts,
            window=window,
        )

        run_counts.additional_properties = d
        return run_counts

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
