from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="UsageDay")


@_attrs_define
class UsageDay:
    """One UTC day of a tenant's usage.

    Attributes:
        completion_tokens (int):
        estimated_tokens (int):
        prompt_tokens (int):
        runs (int):
        tool_calls (int):
        total_tokens (int):
        day (datetime.date):
    """

    completion_tokens: int
    estimated_tokens: int
    prompt_tokens: int
    runs: int
    tool_calls: int
    total_tokens: int
    day: datetime.date
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        completion_tokens = self.completion_tokens

        estimated_tokens = self.estimated_tokens

        prompt_tokens = self.prompt_tokens

        runs = self.runs

        tool_calls = self.tool_calls

        total_tokens = self.total_tokens

        day = self.day.isoformat()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "completion_tokens": completion_tokens,
                "estimated_tokens": estimated_tokens,
                "prompt_tokens": prompt_tokens,
                "runs": runs,
                "tool_calls": tool_calls,
                "total_tokens": total_tokens,
                "day": day,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        completion_tokens = d.pop("completion_tokens")

        estimated_tokens = d.pop("estimated_tokens")

        prompt_tokens = d.pop("prompt_tokens")

        runs = d.pop("runs")

        tool_calls = d.pop("tool_calls")

        total_tokens = d.pop("total_tokens")

        day = datetime.date.fromisoformat(d.pop("day"))

        usage_day = cls(
            completion_tokens=completion_tokens,
            estimated_tokens=estimated_tokens,
            prompt_tokens=prompt_tokens,
            runs=runs,
            tool_calls=tool_calls,
            total_tokens=total_tokens,
            day=day,
        )

        usage_day.additional_properties = d
        return usage_day

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
