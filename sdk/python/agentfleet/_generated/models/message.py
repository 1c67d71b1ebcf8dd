from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.message_body import MessageBody


T = TypeVar("T", bound="Message")


@_attrs_define
class Message:
    """One message of a thread.

    Attributes:
        body (MessageBody): The message as the model sees it.
        created_at (datetime.datetime):
        id (int):
        is_llm_message (bool):
        role (str): `user`, `assistant`, `tool`, or `status` (not sent to the model: e.g. a
            `context_compacted` record, whose body says what compaction did and holds its summary).
        run_id (None | Unset | UUID): The run that added it; null for messages from before runs were recorded.
    """

    body: MessageBody
    created_at: datetime.datetime
    id: int
    is_llm_message: bool
    role: str
    run_id: None | Unset | UUID = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        body = self.body.to_dict()

        created_at = self.created_at.isoformat()

        id = self.id

        is_llm_message = self.is_llm_message

        role = self.role

        run_id: None | str | Unset
        if isinstance(self.run_id, Unset):
            run_id = UNSET
        elif isinstance(self.run_id, UUID):
            run_id = str(self.run_id)
        else:
            run_id = self.run_id

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "body": body,
                "created_at": created_at,
                "id": id,
                "is_llm_message": is_llm_message,
                "role": role,
            }
        )
        if run_id is not UNSET:
            field_dict["run_id"] = run_id

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.message_body import MessageBody

        d = dict(src_dict)
        body = MessageBody.from_dict(d.pop("body"))

        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        id = d.pop("id")

        is_llm_message = d.pop("is_llm_message")

        role = d.pop("role")

        def _parse_run_id(data: object) -> None | Unset | UUID:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                run_id_type_0 = UUID(data)

                return run_id_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(None | Unset | UUID, data)

        run_id = _parse_run_id(d.pop("run_id", UNSET))

        message = cls(
            body=body,
            created_at=created_at,
            id=id,
            is_llm_message=is_llm_message,
            role=role,
            run_id=run_id,
        )

        message.additional_properties = d
        return message

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
