from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.event_envelope_type import EventEnvelopeType

T = TypeVar("T", bound="EventEnvelope")


@_attrs_define
class EventEnvelope:
    """
    Attributes:
        at (datetime.datetime):
        data (Any): Per type: see docs/events.md
        id (int): Gap-free from 1 within the run
        run_id (UUID):
        thread_id (UUID):
        type_ (EventEnvelopeType):
    """

    at: datetime.datetime
    data: Any
    id: int
    run_id: UUID
    thread_id: UUID
    type_: EventEnvelopeType
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        at = self.at.isoformat()

        data = self.data

        id = self.id

        run_id = str(self.run_id)

        thread_id = str(self.thread_id)

        type_ = self.type_.value

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "at": at,
                "data": data,
                "id": id,
                "run_id": run_id,
                "thread_id": thread_id,
                "type": type_,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        at = datetime.datetime.fromisoformat(d.pop("at"))

        data = d.pop("data")

        id = d.pop("id")

        run_id = UUID(d.pop("run_id"))

        thread_id = UUID(d.pop("thread_id"))

        type_ = EventEnvelopeType(d.pop("type"))

        event_envelope = cls(
            at=at,
            data=data,
            id=id,
            run_id=run_id,
            thread_id=thread_id,
            type_=type_,
        )

        event_envelope.additional_properties = d
        return event_envelope

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
