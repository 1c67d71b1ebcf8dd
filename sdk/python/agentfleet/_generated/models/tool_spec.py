from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..models.risk import Risk
from ..models.tool_kind import ToolKind
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.json_object import JsonObject


T = TypeVar("T", bound="ToolSpec")


@_attrs_define
class ToolSpec:
    """
    Attributes:
        kind (ToolKind):
        name (str): Unique within the agent; not a built-in tool (`complete`, `ask`, `expand_message`)
        description (str | Unset):
        parameters (JsonObject | Unset):
        risk (Risk | Unset):
        server (None | str | Unset): `mcp`: a server registered under `/v1/mcp-servers`, by name (instead of `url`).
        timeout_ms (int | None | Unset): Deadline of one call; the worker's `tool_timeout_ms` when absent.
        tools (list[str] | None | Unset): `mcp`: the server's tools to offer (all when absent)
        url (str | Unset): Absolute `http` or `https` URL with a host: no whitespace, control characters, backslashes or
            `user:password@`
    """

    kind: ToolKind
    name: str
    description: str | Unset = UNSET
    parameters: JsonObject | Unset = UNSET
    risk: Risk | Unset = UNSET
    server: None | str | Unset = UNSET
    timeout_ms: int | None | Unset = UNSET
    tools: list[str] | None | Unset = UNSET
    url: str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        kind = self.kind.value

        name = self.name

        description = self.description

        parameters: dict[str, Any] | Unset = UNSET
        if not isinstance(self.parameters, Unset):
            parameters = self.parameters.to_dict()

        risk: str | Unset = UNSET
        if not isinstance(self.risk, Unset):
            risk = self.risk.value

        server: None | str | Unset
        if isinstance(self.server, Unset):
            server = UNSET
        else:
            server = self.server

        timeout_ms: int | None | Unset
        if isinstance(self.timeout_ms, Unset):
            timeout_ms = UNSET
        else:
            timeout_ms = self.timeout_ms

        tools: list[str] | None | Unset
        if isinstance(self.tools, Unset):
            tools = UNSET
        elif isinstance(self.tools, list):
            tools = self.tools

        else:
            tools = self.tools

        url = self.url

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "kind": kind,
                "name": name,
            }
        )
        if description is not UNSET:
            field_dict["description"] = description
        if parameters is not UNSET:
            field_dict["parameters"] = parameters
        if risk is not UNSET:
            field_dict["risk"] = risk
        if server is not UNSET:
            field_dict["server"] = server
        if timeout_ms is not UNSET:
            field_dict["timeout_ms"] = timeout_ms
        if tools is not UNSET:
            field_dict["tools"] = tools
        if url is not UNSET:
            field_dict["url"] = url

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.json_object import JsonObject

        d = dict(src_dict)
        kind = ToolKind(d.pop("kind"))

        name = d.pop("name")

        description = d.pop("description", UNSET)

        _parameters = d.pop("parameters", UNSET)
        parameters: JsonObject | Unset
        if isinstance(_parameters, Unset):
            parameters = UNSET
        else:
            parameters = JsonObject.from_dict(_parameters)

        _risk = d.pop("risk", UNSET)
        risk: Risk | Unset
        if isinstance(_risk, Unset):
            risk = UNSET
        else:
            risk = Risk(_risk)

        def _parse_server(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        server = _parse_server(d.pop("server", UNSET))

        def _parse_timeout_ms(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        timeout_ms = _parse_timeout_ms(d.pop("timeout_ms", UNSET))

        def _parse_tools(data: object) -> list[str] | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, list):
                    raise TypeError()
                tools_type_0 = cast(list[str], data)

                return tools_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(list[str] | None | Unset, data)

        tools = _parse_tools(d.pop("tools", UNSET))

        url = d.pop("url", UNSET)

        tool_spec = cls(
            kind=kind,
            name=name,
            description=description,
            parameters=parameters,
            risk=risk,
            server=server,
            timeout_ms=timeout_ms,
            tools=tools,
            url=url,
        )

        return tool_spec
