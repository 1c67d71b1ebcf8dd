from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="Usage")


@_attrs_define
class Usage:
    """What the run's model calls used. Where a provider reported no usage for a call, the
    worker estimated it with a tokenizer: `estimated_tokens` is that part of the total, and
    `estimated` says whether there is any.

        Attributes:
            completion_tokens (int):
            estimated (bool):
            estimated_tokens (int):
            prompt_tokens (int):
            tool_calls (int): Tool calls the model made.
            total_tokens (int):
    """

    completion_tokens: int
    estimated: bool
    estimated_tokens: int
    prompt_tokens: int
    tool_calls: int
    total_tokens: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        completion_tokens = self.completion_tokens

        estimated = self.estimated

        estimated_tokens = self.estimated_tokens

        prompt_tokens = self.prompt_tokens

        tool_calls = self.tool_calls

        total_tokens = self.total_tokens

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "completion_tokens": completion_tokens,
                "estimated": estimated,
                "estimated_tokens": estimated_tokens,
                "prompt_tokens": prompt_tokens,
                "tool_calls": tool_calls,
                "total_tokens": total_tokens,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        completion_tokens = d.pop("completion_tokens")

        estimated = d.pop("estimated")

        estimated_tokens = d.pop("estimated_tokens")

        prompt_tokens = d.pop("prompt_tokens")

        tool_calls = d.pop("tool_calls")

        total_tokens = d.pop("total_tokens")

        usage = cls(
            completion_tokens=completion_tokens,
            estimated=estimated,
            estimated_tokens=estimated_tokens,
            prompt_tokens=prompt_tokens,
            tool_calls=tool_calls,
            total_tokens=total_tokens,
        )

        usage.additional_properties = d
        return usage

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
