from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="WebhookCreated")


@_attrs_define
class WebhookCreated:
    """A registered endpoint and its secret, shown this once.

    Attributes:
        created_at (datetime.datetime):
        description (str):
        events (list[str]):
        id (UUID):
        secret (str): `whsec_<base64>`: the HMAC key (decoded) of every delivery's `webhook-signature`.
        url (str):
    """

    created_at: datetime.datetime
    description: str
    events: list[str]
    id: UUID
    secret: str
    url: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        created_at = self.created_at.isoformat()

        description = self.description

        events = self.events

        id = str(self.id)

        secret = self.secret

        url = self.url

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "description": description,
                "events": events,
                "id": id,
                "secret": secret,
                "url": url,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        description = d.pop("description")

        events = cast(list[str], d.pop("events"))

        id = UUID(d.pop("id"))

        secret = d.pop("secret")

        url = d.pop("url")

        webhook_created = cls(
            created_at=created_at,
            description=description,
            events=events,
            id=id,
            secret=secret,
            url=url,
        )

        webhook_created.additional_properties = d
        return webhook_created

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
