from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..models.agent_mode import AgentMode
from ..models.run_status import RunStatus
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.agent_spec import AgentSpec
    from ..models.error_detail import ErrorDetail
    from ..models.plan_view import PlanView
    from ..models.run_metadata import RunMetadata
    from ..models.run_pending_type_0 import RunPendingType0
    from ..models.task_place import TaskPlace
    from ..models.usage import Usage


T = TypeVar("T", bound="Run")


@_attrs_define
class Run:
    """A run, as every endpoint returns it.

    Attributes:
        agent (AgentSpec):
        attempt (int): How many times a worker has claimed the run.
        created_at (datetime.datetime):
        id (UUID):
        iteration (int): Model calls made so far.
        max_iterations (int):
        metadata (RunMetadata):
        mode (AgentMode):
        quarantined (bool): The run is in quarantine: its workers stopped responding while holding it more times
            than the deployment allows, so each of its attempts now runs alone in a worker. If such
            a worker stops responding too, the run fails with `poison_run`; otherwise it goes on as
            any run.
        status (RunStatus): The statuses of a run (docs/architecture.md); stored as text in `runs.status`.
        thread_id (UUID):
        updated_at (datetime.datetime):
        usage (Usage): What the run's model calls used. Where a provider reported no usage for a call, the
            worker estimated it with a tokenizer: `estimated_tokens` is that part of the total, and
            `estimated` says whether there is any.
        error (ErrorDetail | None | Unset):
        finished_at (datetime.datetime | None | Unset):
        parent_run_id (None | Unset | UUID): A plan's task: the plan-and-solve run that created it; otherwise null.
        pending (None | RunPendingType0 | Unset): While the run waits: `{"kind": "input", ...}` (a question),
            `{"kind": "confirmation", "tool_calls": [...]}`, or `{"kind": "budget", "budget",
            "used", "limit", "question"}` (the tenant's daily token budget, answered with
            `input`); otherwise null.
        plan (None | PlanView | Unset):
        started_at (datetime.datetime | None | Unset):
        task (None | TaskPlace | Unset):
    """

    agent: AgentSpec
    attempt: int
    created_at: datetime.datetime
    id: UUID
    iteration: int
    max_iterations: int
    metadata: RunMetadata
    mode: AgentMode
    quarantined: bool
    status: RunStatus
    thread_id: UUID
    updated_at: datetime.datetime
    usage: Usage
    error: ErrorDetail | None | Unset = UNSET
    finished_at: datetime.datetime | None | Unset = UNSET
    parent_run_id: None | Unset | UUID = UNSET
    pending: None | RunPendingType0 | Unset = UNSET
    plan: None | PlanView | Unset = UNSET
    started_at: datetime.datetime | None | Unset = UNSET
    task: None | TaskPlace | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.error_detail import ErrorDetail
        from ..models.plan_view import PlanView
        from ..models.run_pending_type_0 import RunPendingType0
        from ..models.task_place import TaskPlace

        agent = self.agent.to_dict()

        attempt = self.attempt

        created_at = self.created_at.isoformat()

        id = str(self.id)

        iteration = self.iteration

        max_iterations = self.max_iterations

        metadata = self.metadata.to_dict()

        mode = self.mode.value

        quarantined = self.quarantined

        status = self.status.value

        thread_id = str(self.thread_id)

        updated_at = self.updated_at.isoformat()

        usage = self.usage.to_dict()

        error: dict[str, Any] | None | Unset
        if isinstance(self.error, Unset):
            error = UNSET
        elif isinstance(self.error, ErrorDetail):
            error = self.error.to_dict()
        else:
            error = self.error

        finished_at: None | str | Unset
        if isinstance(self.finished_at, Unset):
            finished_at = UNSET
        elif isinstance(self.finished_at, datetime.datetime):
            finished_at = self.finished_at.isoformat()
        else:
            finished_at = self.finished_at

        parent_run_id: None | str | Unset
        if isinstance(self.parent_run_id, Unset):
            parent_run_id = UNSET
        elif isinstance(self.parent_run_id, UUID):
            parent_run_id = str(self.parent_run_id)
        else:
            parent_run_id = self.parent_run_id

        pending: dict[str, Any] | None | Unset
        if isinstance(self.pending, Unset):
            pending = UNSET
        elif isinstance(self.pending, RunPendingType0):
            pending = self.pending.to_dict()
        else:
            pending = self.pending

        plan: dict[str, Any] | None | Unset
        if isinstance(self.plan, Unset):
            plan = UNSET
        elif isinstance(self.plan, PlanView):
            plan = self.plan.to_dict()
        else:
            plan = self.plan

        started_at: None | str | Unset
        if isinstance(self.started_at, Unset):
            started_at = UNSET
        elif isinstance(self.started_at, datetime.datetime):
            started_at = self.started_at.isoformat()
        else:
            started_at = self.started_at

        task: dict[str, Any] | None | Unset
        if isinstance(self.task, Unset):
            task = UNSET
        elif isinstance(self.task, TaskPlace):
            task = self.task.to_dict()
        else:
            task = self.task

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "agent": agent,
                "attempt": attempt,
                "created_at": created_at,
                "id": id,
                "iteration": iteration,
                "max_iterations": max_iterations,
                "metadata": metadata,
                "mode": mode,
                "quarantined": quarantined,
                "status": status,
                "thread_id": thread_id,
                "updated_at": updated_at,
                "usage": usage,
            }
        )
        if error is not UNSET:
            field_dict["error"] = error
        if finished_at is not UNSET:
            field_dict["finished_at"] = finished_at
        if parent_run_id is not UNSET:
            field_dict["parent_run_id"] = parent_run_id
        if pending is not UNSET:
            field_dict["pending"] = pending
        if plan is not UNSET:
            field_dict["plan"] = plan
        if started_at is not UNSET:
            field_dict["started_at"] = started_at
        if task is not UNSET:
            field_dict["task"] = task

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.agent_spec import AgentSpec
        from ..models.error_detail import ErrorDetail
        from ..models.plan_view import PlanView
        from ..models.run_metadata import RunMetadata
        from ..models.run_pending_type_0 import RunPendingType0
        from ..models.task_place import TaskPlace
        from ..models.usage import Usage

        d = dict(src_dict)
        agent = AgentSpec.from_dict(d.pop("agent"))

        attempt = d.pop("attempt")

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        id = UUID(d.pop("id"))

        iteration = d.pop("iteration")

        max_iterations = d.pop("max_iterations")

        metadata = RunMetadata.from_dict(d.pop("metadata"))

        mode = AgentMode(d.pop("mode"))

        quarantined = d.pop("quarantined")

        status = RunStatus(d.pop("status"))

        thread_id = UUID(d.pop("thread_id"))

        updated_at = datetime.datetime.fromisoformat(d.pop("updated_at"))

        usage = Usage.from_dict(d.pop("usage"))

        def _parse_error(data: object) -> ErrorDetail | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                error_type_1 = ErrorDetail.from_dict(data)

                return error_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(ErrorDetail | None | Unset, data)

        error = _parse_error(d.pop("error", UNSET))

        def _parse_finished_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                finished_at_type_0 = datetime.datetime.fromisoformat(data)

                return finished_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        finished_at = _parse_finished_at(d.pop("finished_at", UNSET))

        def _parse_parent_run_id(data: object) -> None | Unset | UUID:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                parent_run_id_type_0 = UUID(data)

                return parent_run_id_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | Unset | UUID, data)

        parent_run_id = _parse_parent_run_id(d.pop("parent_run_id", UNSET))

        def _parse_pending(data: object) -> None | RunPendingType0 | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                pending_type_0 = RunPendingType0.from_dict(data)

                return pending_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | RunPendingType0 | Unset, data)

        pending = _parse_pending(d.pop("pending", UNSET))

        def _parse_plan(data: object) -> None | PlanView | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                plan_type_1 = PlanView.from_dict(data)

                return plan_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | PlanView | Unset, data)

        plan = _parse_plan(d.pop("plan", UNSET))

        def _parse_started_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                started_at_type_0 = datetime.datetime.fromisoformat(data)

                return started_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        started_at = _parse_started_at(d.pop("started_at", UNSET))

        def _parse_task(data: object) -> None | TaskPlace | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                task_type_1 = TaskPlace.from_dict(data)

                return task_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | TaskPlace | Unset, data)

        task = _parse_task(d.pop("task", UNSET))

        run = cls(
            agent=agent,
            attempt=attempt,
            created_at=created_at,
            id=id,
            iteration=iteration,
            max_iterations=max_iterations,
            metadata=metadata,
            mode=mode,
            quarantined=quarantined,
            status=status,
            thread_id=thread_id,
            updated_at=updated_at,
            usage=usage,
            error=error,
            finished_at=finished_at,
            parent_run_id=parent_run_id,
            pending=pending,
            plan=plan,
            started_at=started_at,
            task=task,
        )

        run.additional_properties = d
        return run

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
