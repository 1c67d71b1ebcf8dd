from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="HeaderBody")


@_attrs_define
class HeaderBody:
    """
    Attributes:
        name (str):
        value (str): Visible ASCII, spaces and tabs; at most `mcp.max_header_value_bytes`.
    """

    name: str
    value: str

    def to_dict(self) -> dict[str, Any]:
        name = self.name

        value = self.value

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "name": name,
                "value": value,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        name = d.pop("name")

        value = d.pop("value")

        header_body = cls(
            name=name,
            value=value,
        )

        return header_body
