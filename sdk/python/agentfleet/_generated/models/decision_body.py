from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="DecisionBody")


@_attrs_define
class DecisionBody:
    """
    Attributes:
        approve (bool):
        tool_call_id (str):
        reason (None | str | Unset): Why: no NUL, at most 262144 bytes of UTF-8 (`api.max_input_bytes`)
    """

    approve: bool
    tool_call_id: str
    reason: None | str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        approve = self.approve

        tool_call_id = self.tool_call_id

        reason: None | str | Unset
        if isinstance(self.reason, Unset):
            reason = UNSET
        else:
            reason = self.reason

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "approve": approve,
                "tool_call_id": tool_call_id,
            }
        )
        if reason is not UNSET:
            field_dict["reason"] = reason

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        approve = d.pop("approve")

        tool_call_id = d.pop("tool_call_id")

        def _parse_reason(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        reason = _parse_reason(d.pop("reason", UNSET))

        decision_body = cls(
            approve=approve,
            tool_call_id=tool_call_id,
            reason=reason,
        )

        return decision_body
