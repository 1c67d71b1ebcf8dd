from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.header_body import HeaderBody


T = TypeVar("T", bound="CreateMcpServer")


@_attrs_define
class CreateMcpServer:
    """
    Attributes:
        name (str): How agents name it: 1-64 characters of `[A-Za-z0-9_-]`, unique within the tenant.
        url (str): The streamable-HTTP endpoint; an address the egress policy refuses is refused
        description (None | str | Unset): Free text, at most 1000 characters.
        headers (list[HeaderBody] | None | Unset): Sent with every request to the server (e.g. `Authorization`), at most
            `mcp.max_headers`,
            their names distinct in any case. Write-only: stored sealed, answered as names only.
            Needs `mcp.encryption_key`.
    """

    name: str
    url: str
    description: None | str | Unset = UNSET
    headers: list[HeaderBody] | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        name = self.name

        url = self.url

        description: None | str | Unset
        if isinstance(self.description, Unset):
            description = UNSET
        else:
            description = self.description

        headers: list[dict[str, Any]] | None | Unset
        if isinstance(self.headers, Unset):
            headers = UNSET
        elif isinstance(self.headers, list):
            headers = []
            for headers_type_0_item_data in self.headers:
                headers_type_0_item = headers_type_0_item_data.to_dict()
                headers.append(headers_type_0_item)

        else:
            headers = self.headers

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "name": name,
                "url": url,
            }
        )
        if description is not UNSET:
            field_dict["description"] = description
        if headers is not UNSET:
            field_dict["headers"] = headers

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.header_body import HeaderBody

        d = dict(src_dict)
        name = d.pop("name")

        url = d.pop("url")

        def _parse_description(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        description = _parse_description(d.pop("description", UNSET))

        def _parse_headers(data: object) -> list[HeaderBody] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                headers_type_0 = []
                _headers_type_0 = data
                for headers_type_0_item_data in _headers_type_0:
                    headers_type_0_item = HeaderBody.from_dict(headers_type_0_item_data)

                    headers_type_0.append(headers_type_0_item)

                return headers_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[HeaderBody] | None | Unset, data)

        headers = _parse_headers(d.pop("headers", UNSET))

        create_mcp_server = cls(
            name=name,
            url=url,
            description=description,
            headers=headers,
        )

        return create_mcp_server
