from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.usage_day import UsageDay
    from ..models.usage_figures import UsageFigures


T = TypeVar("T", bound="UsageReport")


@_attrs_define
class UsageReport:
    """A tenant's usage over `from..=to` (UTC days, inclusive).

    Attributes:
        days (list[UsageDay]): The days with any usage, oldest first (a day without any is left out).
        from_ (datetime.date):
        to (datetime.date):
        total (UsageFigures): Tokens (prompt + completion = total; `estimated_tokens` of it were estimated by the
            worker because the provider reported none), tool calls the model made, and runs whose
            first model call fell in the period.
    """

    days: list[UsageDay]
    from_: datetime.date
    to: datetime.date
    total: UsageFigures
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        days = []
        for days_item_data in self.days:
            days_item = days_item_data.to_dict()
            days.append(days_item)

        from_ = self.from_.isoformat()

        to = self.to.isoformat()

        total = self.total.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "days": days,
                "from": from_,
                "to": to,
                "total": total,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.usage_day import UsageDay
        from ..models.usage_figures import UsageFigures

        d = dict(src_dict)
        days = []
        _days = d.pop("days")
        for days_item_data in _days:
            days_item = UsageDay.from_dict(days_item_data)

            days.append(days_item)

        from_ = datetime.date.fromisoformat(d.pop("from"))

        to = datetime.date.fromisoformat(d.pop("to"))

        total = UsageFigures.from_dict(d.pop("total"))

        usage_report = cls(
            days=days,
            from_=from_,
            to=to,
            total=total,
        )

        usage_report.additional_properties = d
        return usage_report

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
