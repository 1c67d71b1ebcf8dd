from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast
from uuid import UUID

from attrs import define as _attrs_define

from ..models.if_busy import IfBusy
from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.agent_spec import AgentSpec
    from ..models.json_object import JsonObject


T = TypeVar("T", bound="CreateRun")


@_attrs_define
class CreateRun:
    """
    Attributes:
        agent (AgentSpec):
        input_ (str): The user message: not blank, no NUL, at most 262144 bytes of UTF-8 (`api.max_input_bytes`)
        if_busy (IfBusy | None | Unset):
        metadata (JsonObject | None | Unset):
        thread_id (None | Unset | UUID): Continue this thread; a new thread is made when absent.
    """

    agent: AgentSpec
    input_: str
    if_busy: IfBusy | None | Unset = UNSET
    metadata: JsonObject | None | Unset = UNSET
    thread_id: None | Unset | UUID = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.json_object import JsonObject

        agent = self.agent.to_dict()

        input_ = self.input_

        if_busy: None | str | Unset
        if isinstance(self.if_busy, Unset):
            if_busy = UNSET
        elif isinstance(self.if_busy, IfBusy):
            if_busy = self.if_busy.value
        else:
            if_busy = self.if_busy

        metadata: dict[str, Any] | None | Unset
        if isinstance(self.metadata, Unset):
            metadata = UNSET
        elif isinstance(self.metadata, JsonObject):
            metadata = self.metadata.to_dict()
        else:
            metadata = self.metadata

        thread_id: None | str | Unset
        if isinstance(self.thread_id, Unset):
            thread_id = UNSET
        elif isinstance(self.thread_id, UUID):
            thread_id = str(self.thread_id)
        else:
            thread_id = self.thread_id

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "agent": agent,
                "input": input_,
            }
        )
        if if_busy is not UNSET:
            field_dict["if_busy"] = if_busy
        if metadata is not UNSET:
            field_dict["metadata"] = metadata
        if thread_id is not UNSET:
            field_dict["thread_id"] = thread_id

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.agent_spec import AgentSpec
        from ..models.json_object import JsonObject

        d = dict(src_dict)
        agent = AgentSpec.from_dict(d.pop("agent"))

        input_ = d.pop("input")

        def _parse_if_busy(data: object) -> IfBusy | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                if_busy_type_1 = IfBusy(data)

                return if_busy_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(IfBusy | None | Unset, data)

        if_busy = _parse_if_busy(d.pop("if_busy", UNSET))

        def _parse_metadata(data: object) -> JsonObject | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                metadata_type_1 = JsonObject.from_dict(data)

                return metadata_type_1
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(JsonObject | None | Unset, data)

        metadata = _parse_metadata(d.pop("metadata", UNSET))

        def _parse_thread_id(data: object) -> None | Unset | UUID:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                thread_id_type_0 = UUID(data)

                return thread_id_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | Unset | UUID, data)

        thread_id = _parse_thread_id(d.pop("thread_id", UNSET))

        create_run = cls(
            agent=agent,
            input_=input_,
            if_busy=if_busy,
            metadata=metadata,
            thread_id=thread_id,
        )

        return create_run
