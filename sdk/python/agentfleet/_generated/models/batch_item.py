from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast
from uuid import UUID

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.agent_spec import AgentSpec
    from ..models.json_object import JsonObject


T = TypeVar("T", bound="BatchItem")


@_attrs_define
class BatchItem:
    """One run of a batch: the body of `POST /v1/runs` and the caller's name for it.

    Attributes:
        agent (AgentSpec):
        custom_id (str): Unique within the batch, 1 to 128 characters; the results name the item by it.
        input_ (str): The user message: not blank, no NUL, at most 262144 bytes of UTF-8 (`api.max_input_bytes`)
        metadata (JsonObject | None | Unset):
        thread_id (None | Unset | UUID):
    """

    agent: AgentSpec
    custom_id: str
    input_: str
    metadata: JsonObject | None | Unset = UNSET
    thread_id: None | Unset | UUID = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.json_object import JsonObject

        agent = self.agent.to_dict()

        custom_id = self.custom_id

        input_ = self.input_

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
                "custom_id": custom_id,
                "input": input_,
            }
        )
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

        custom_id = d.pop("custom_id")

        input_ = d.pop("input")

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

        batch_item = cls(
            agent=agent,
            custom_id=custom_id,
            input_=input_,
            metadata=metadata,
            thread_id=thread_id,
        )

        return batch_item
