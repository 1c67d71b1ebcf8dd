from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.decision_body import DecisionBody


T = TypeVar("T", bound="ResumeBody")


@_attrs_define
class ResumeBody:
    """Exactly one of `input` (answers a question, or continues after a budget pause) or
    `decisions` (settles confirmations).

        Attributes:
            decisions (list[DecisionBody] | Unset): Settles every pending confirmation
            input_ (str | Unset): Answers a question: not blank, no NUL, at most 262144 bytes of UTF-8
                (`api.max_input_bytes`)
    """

    decisions: list[DecisionBody] | Unset = UNSET
    input_: str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        decisions: list[dict[str, Any]] | Unset = UNSET
        if not isinstance(self.decisions, Unset):
            decisions = []
            for decisions_item_data in self.decisions:
                decisions_item = decisions_item_data.to_dict()
                decisions.append(decisions_item)

        input_ = self.input_

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if decisions is not UNSET:
            field_dict["decisions"] = decisions
        if input_ is not UNSET:
            field_dict["input"] = input_

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.decision_body import DecisionBody

        d = dict(src_dict)
        _decisions = d.pop("decisions", UNSET)
        decisions: list[DecisionBody] | Unset = UNSET
        if _decisions is not UNSET:
            decisions = []
            for decisions_item_data in _decisions:
                decisions_item = DecisionBody.from_dict(decisions_item_data)

                decisions.append(decisions_item)

        input_ = d.pop("input", UNSET)

        resume_body = cls(
            decisions=decisions,
            input_=input_,
        )

        return resume_body
