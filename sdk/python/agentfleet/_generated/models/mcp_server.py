from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="McpServer")


@_attrs_define
class McpServer:
    """A server as its tenant sees it: header names, never their values.

    Attributes:
        created_at (datetime.datetime):
        description (str):
        header_names (list[str]): Names of the headers sent with every request to the server (values are write-only).
        id (UUID):
        name (str):
        url (str):
    """

    created_at: datetime.datetime
    description: str
    header_names: list[str]
    id: UUID
    name: str
    url: str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        created_at = self.created_at.isoformat()

        description = self.description

        header_names = self.header_names

        id = str(self.id)

        name = self.name

        url = self.url

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "description": description,
                "header_names": header_names,
                "id": id,
                "name": name,
                "url": url,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        description = d.pop("description")

        header_names = cast(list[str], d.pop("header_names"))

        id = UUID(d.pop("id"))

        name = d.pop("name")

        url = d.pop("url")

        mcp_server = cls(
            created_at=created_at,
            description=description,
            header_names=header_names,
            id=id,
            name=name,
            url=url,
        )

        mcp_server.additional_properties = d
        return mcp_server

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
