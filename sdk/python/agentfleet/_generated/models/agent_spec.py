from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.tool_spec import ToolSpec


T = TypeVar("T", bound="AgentSpec")


@_attrs_define
class AgentSpec:
    """
    Attributes:
        model (str): The name of a model this deployment configures (`models.<name>`)
        max_iterations (int | None | Unset): Model calls at most; `worker.default_max_iterations` when null.
        max_parallel_tool_calls (int | None | Unset): Tool calls of one response that run at once;
            `worker.max_parallel_tool_calls` when
            absent, and never more than it.
        max_tokens_total (int | None | Unset): The run's token budget (prompt + completion over all its model calls):
            once reached,
            the run fails with `budget_exceeded` instead of calling the model again. At most
            `api.max_tokens_total`.
        system_prompt (None | str | Unset): At most 200000 bytes of UTF-8, no NUL.
        tools (list[ToolSpec] | Unset): At most `api.max_tools_per_agent` tools, with distinct names
    """

    model: str
    max_iterations: int | None | Unset = UNSET
    max_parallel_tool_calls: int | None | Unset = UNSET
    max_tokens_total: int | None | Unset = UNSET
    system_prompt: None | str | Unset = UNSET
    tools: list[ToolSpec] | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        model = self.model

        max_iterations: int | None | Unset
        if isinstance(self.max_iterations, Unset):
            max_iterations = UNSET
        else:
            max_iterations = self.max_iterations

        max_parallel_tool_calls: int | None | Unset
        if isinstance(self.max_parallel_tool_calls, Unset):
            max_parallel_tool_calls = UNSET
        else:
            max_parallel_tool_calls = self.max_parallel_tool_calls

        max_tokens_total: int | None | Unset
        if isinstance(self.max_tokens_total, Unset):
            max_tokens_total = UNSET
        else:
            max_tokens_total = self.max_tokens_total

        system_prompt: None | str | Unset
        if isinstance(self.system_prompt, Unset):
            system_prompt = UNSET
        else:
            system_prompt = self.system_prompt

        tools: list[dict[str, Any]] | Unset = UNSET
        if not isinstance(self.tools, Unset):
            tools = []
            for tools_item_data in self.tools:
                tools_item = tools_item_data.to_dict()
                tools.append(tools_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "model": model,
            }
        )
        if max_iterations is not UNSET:
            field_dict["max_iterations"] = max_iterations
        if max_parallel_tool_calls is not UNSET:
            field_dict["max_parallel_tool_calls"] = max_parallel_tool_calls
        if max_tokens_total is not UNSET:
            field_dict["max_tokens_total"] = max_tokens_total
        if system_prompt is not UNSET:
            field_dict["system_prompt"] = system_prompt
        if tools is not UNSET:
            field_dict["tools"] = tools

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.tool_spec import ToolSpec

        d = dict(src_dict)
        model = d.pop("model")

        def _parse_max_iterations(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        max_iterations = _parse_max_iterations(d.pop("max_iterations", UNSET))

        def _parse_max_parallel_tool_calls(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        max_parallel_tool_calls = _parse_max_parallel_tool_calls(
            d.pop("max_parallel_tool_calls", UNSET)
        )

        def _parse_max_tokens_total(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        max_tokens_total = _parse_max_tokens_total(d.pop("max_tokens_total", UNSET))

        def _parse_system_prompt(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        system_prompt = _parse_system_prompt(d.pop("system_prompt", UNSET))

        _tools = d.pop("tools", UNSET)
        tools: list[ToolSpec] | Unset = UNSET
        if _tools is not UNSET:
            tools = []
            for tools_item_data in _tools:
                tools_item = ToolSpec.from_dict(tools_item_data)

                tools.append(tools_item)

        agent_spec = cls(
            model=model,
            max_iterations=max_iterations,
            max_parallel_tool_calls=max_parallel_tool_calls,
            max_tokens_total=max_tokens_total,
            system_prompt=system_prompt,
            tools=tools,
        )

        return agent_spec
