from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="UsageFigures")


@_attrs_define
class UsageFigures:
    """Tokens (prompt + completion = total; `estimated_tokens` of it were estimated by the
    worker because the provider reported none), tool calls the model made, and runs whose
    first model call fell in the period.

        Attributes:
            completion_tokens (int):
            estimated_tokens (int):
            prompt_tokens (int):
            runs (int):
            tool_calls (int):
            total_tokens (int):
    """

    completion_tokens: int
    estimated_tokens: int
    prompt_tokens: int
    runs: int
    tool_calls: int
    total_tokens: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        completion_tokens = self.completion_tokens

        estimated_tokens = self.estimated_tokens

        prompt_tokens = self.prompt_tokens

        runs = self.runs

        tool_calls = self.tool_calls

        total_tokens = self.total_tokens

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

        usage_figures = cls(
            completion_tokens=completion_tokens,
            estimated_tokens=estimated_tokens,
            prompt_tokens=prompt_tokens,
            runs=runs,
            tool_calls=tool_calls,
            total_tokens=total_tokens,
        )

        usage_figures.additional_properties = d
        return usage_figures

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
