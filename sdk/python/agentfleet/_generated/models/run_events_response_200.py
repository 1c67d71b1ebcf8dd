from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.run_events_response_200_event import RunEventsResponse200Event
from ..types import UNSET, Unset

T = TypeVar("T", bound="RunEventsResponse200")


@_attrs_define
class RunEventsResponse200:
    """
    Attributes:
        data (str):
        event (RunEventsResponse200Event):
        id (str):
        retry (int | Unset):
    """

    data: str
    event: RunEventsResponse200Event
    id: str
    retry: int | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = self.data

        event = self.event.value

        id = self.id

        retry = self.retry

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "data": data,
                "event": event,
                "id": id,
            }
        )
        if retry is not UNSET:
            field_dict["retry"] = retry

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        data = d.pop("data")

        event = RunEventsResponse200Event(d.pop("event"))

        id = d.pop("id")

        retry = d.pop("retry", UNSET)

        run_events_response_200 = cls(
            data=data,
            event=event,
            id=id,
            retry=retry,
        )

        run_events_response_200.additional_properties = d
        return run_events_response_200

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
