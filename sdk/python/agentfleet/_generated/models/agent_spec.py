from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..models.agent_mode import AgentMode
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.plan_spec import PlanSpec
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
        mode (AgentMode | Unset):
        plan (None | PlanSpec | Unset):
        system_prompt (None | str | Unset): At most 200000 bytes of UTF-8, no NUL.
        tools (list[ToolSpec] | Unset): At most `api.max_tools_per_agent` tools, with distinct names
    """

    model: str
    max_iterations: int | None | Unset = UNSET
    max_parallel_tool_calls: int | None | Unset = UNSET
    max_tokens_total: int | None | Unset = UNSET
    mode: AgentMode | Unset = UNSET
    plan: None | PlanSpec | Unset = UNSET
    system_prompt: None | str | Unset = UNSET
    tools: list[ToolSpec] | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.plan_spec import PlanSpec

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

        mode: str | Unset = UNSET
        if not isinstance(self.mode, Unset):
            mode = self.mode.value

        plan: dict[str, Any] | None | Unset
        if isinstance(self.plan, Unset):
            plan = UNSET
        elif isinstance(self.plan, PlanSpec):
            plan = self.plan.to_dict()
        else:
            plan = self.plan

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
        if mode is not UNSET:
            field_dict["mode"] = mode
        if plan is not UNSET:
            field_dict["plan"] = plan
        if system_prompt is not UNSET:
            field_dict["system_prompt"] = system_prompt
        if tools is not UNSET:
            field_dict["tools"] = tools

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.plan_spec import PlanSpec
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

        _mode = d.pop("mode", UNSET)
        mode: AgentMode | Unset
        if isinstance(_mode, Unset):
            mode = UNSET
        else:
            mode = AgentMode(_mode)

        def _parse_plan(data: object) -> None | PlanSpec | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                plan_type_1 = PlanSpec.from_dict(data)

                return plan_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | PlanSpec | Unset, data)

        plan = _parse_plan(d.pop("plan", UNSET))

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
            mode=mode,
            plan=plan,
            system_prompt=system_prompt,
            tools=tools,
        )

        return agent_spec
