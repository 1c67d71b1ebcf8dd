from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.plan_round import PlanRound


T = TypeVar("T", bound="PlanView")


@_attrs_define
class PlanView:
    """A plan-and-solve run's plan as it stands.

    Attributes:
        rounds (list[PlanRound]):
        rounds_created (int): Rounds created so far.
        task_tokens (int): Prompt + completion tokens of its ended tasks (they count towards the run's budget).
        total_tokens (int): The run's own tokens plus its tasks'.
    """

    rounds: list[PlanRound]
    rounds_created: int
    task_tokens: int
    total_tokens: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        rounds = []
        for rounds_item_data in self.rounds:
            rounds_item = rounds_item_data.to_dict()
            rounds.append(rounds_item)

        rounds_created = self.rounds_created

        task_tokens = self.task_tokens

        total_tokens = self.total_tokens

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "rounds": rounds,
                "rounds_created": rounds_created,
                "task_tokens": task_tokens,
                "total_tokens": total_tokens,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.plan_round import PlanRound

        d = dict(src_dict)
        rounds = []
        _rounds = d.pop("rounds")
        for rounds_item_data in _rounds:
            rounds_item = PlanRound.from_dict(rounds_item_data)

            rounds.append(rounds_item)

        rounds_created = d.pop("rounds_created")

        task_tokens = d.pop("task_tokens")

        total_tokens = d.pop("total_tokens")

        plan_view = cls(
            rounds=rounds,
            rounds_created=rounds_created,
            task_tokens=task_tokens,
            total_tokens=total_tokens,
        )

        plan_view.additional_properties = d
        return plan_view

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
