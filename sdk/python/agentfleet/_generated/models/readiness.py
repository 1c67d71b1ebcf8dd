from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="Readiness")


@_attrs_define
class Readiness:
    """Readiness: whether each backing service answers.

    Attributes:
        event_hub (bool): Whether this process holds a subscription to live events now. Not part of readiness: it
            subscribes only to the runs it serves streams of, until `events.hub_linger_ms` after
            their last stream (false on an idle, healthy API).
        postgres (bool):
        rabbitmq (bool):
        redis (bool):
        status (str): `ready` or `not_ready`.
    """

    event_hub: bool
    postgres: bool
    rabbitmq: bool
    redis: bool
    status: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        event_hub = self.event_hub

        postgres = self.postgres

        rabbitmq = self.rabbitmq

        redis = self.redis

        status = self.status

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "event_hub": event_hub,
                "postgres": postgres,
                "rabbitmq": rabbitmq,
                "redis": redis,
                "status": status,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        event_hub = d.pop("event_hub")

        postgres = d.pop("postgres")

        rabbitmq = d.pop("rabbitmq")

        redis = d.pop("redis")

        status = d.pop("status")

        readiness = cls(
            event_hub=event_hub,
            postgres=postgres,
            rabbitmq=rabbitmq,
            redis=redis,
            status=status,
        )

        readiness.additional_properties = d
        return readiness

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
