from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.agent_spec import AgentSpec


T = TypeVar("T", bound="PlanSpec")


@_attrs_define
class PlanSpec:
    """How a plan-and-solve run plans. Every bound is also capped by the deployment
    (`api.max_plan_rounds`, `api.max_plan_tasks`, `api.max_plan_parallel`).

        Attributes:
            executor (AgentSpec | None | Unset): The agent of every task (`react`, without `plan`); the run's own agent
                without the plan when absent
            max_parallel (int | Unset): Tasks of a round in flight at once; the others wait for a place. Default: 4.
            max_rounds (int | Unset): Rounds of tasks at most; after the last, the planner must call `complete`. Default: 5.
            max_tasks (int | Unset): Tasks one `plan` call may create at most. Default: 8.
            planner_prompt (None | str | Unset): The planner's system prompt (a built-in one when absent). At most 200000
                bytes.
            summary_prompt (None | str | Unset): The system prompt of the summary turn that writes the run's answer (a
                built-in one
                when absent). At most 200000 bytes.
    """

    executor: AgentSpec | None | Unset = UNSET
    max_parallel: int | Unset = 4
    max_rounds: int | Unset = 5
    max_tasks: int | Unset = 8
    planner_prompt: None | str | Unset = UNSET
    summary_prompt: None | str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.agent_spec import AgentSpec

        executor: dict[str, Any] | None | Unset
        if isinstance(self.executor, Unset):
            executor = UNSET
        elif isinstance(self.executor, AgentSpec):
            executor = self.executor.to_dict()
        else:
            executor = self.executor

        max_parallel = self.max_parallel

        max_rounds = self.max_rounds

        max_tasks = self.max_tasks

        planner_prompt: None | str | Unset
        if isinstance(self.planner_prompt, Unset):
            planner_prompt = UNSET
        else:
            planner_prompt = self.planner_prompt

        summary_prompt: None | str | Unset
        if isinstance(self.summary_prompt, Unset):
            summary_prompt = UNSET
        else:
            summary_prompt = self.summary_prompt

        field_dict: dict[str, Any] = {}

        field_dict.update({})
        if executor is not UNSET:
            field_dict["executor"] = executor
        if max_parallel is not UNSET:
            field_dict["max_parallel"] = max_parallel
        if max_rounds is not UNSET:
            field_dict["max_rounds"] = max_rounds
        if max_tasks is not UNSET:
            field_dict["max_tasks"] = max_tasks
        if planner_prompt is not UNSET:
            field_dict["planner_prompt"] = planner_prompt
        if summary_prompt is not UNSET:
            field_dict["summary_prompt"] = summary_prompt

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.agent_spec import AgentSpec

        d = dict(src_dict)

        def _parse_executor(data: object) -> AgentSpec | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                executor_type_1 = AgentSpec.from_dict(data)

                return executor_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(AgentSpec | None | Unset, data)

        executor = _parse_executor(d.pop("executor", UNSET))

        max_parallel = d.pop("max_parallel", UNSET)

        max_rounds = d.pop("max_rounds", UNSET)

        max_tasks = d.pop("max_tasks", UNSET)

        def _parse_planner_prompt(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        planner_prompt = _parse_planner_prompt(d.pop("planner_prompt", UNSET))

        def _parse_summary_prompt(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        summary_prompt = _parse_summary_prompt(d.pop("summary_prompt", UNSET))

        plan_spec = cls(
            executor=executor,
            max_parallel=max_parallel,
            max_rounds=max_rounds,
            max_tasks=max_tasks,
            planner_prompt=planner_prompt,
            summary_prompt=summary_prompt,
        )

        return plan_spec
