from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="CreateKey")


@_attrs_define
class CreateKey:
    """
    Attributes:
        name (str): 1 to 200 characters, e.g. where the key is used.
        expires_at (datetime.datetime | None | Unset): When the key stops working (RFC 3339, in the future). At most one
            of `expires_at`
            and `expires_in_secs`; neither: the key never expires.
        expires_in_secs (int | None | Unset):
    """

    name: str
    expires_at: datetime.datetime | None | Unset = UNSET
    expires_in_secs: int | None | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        name = self.name

        expires_at: None | str | Unset
        if isinstance(self.expires_at, Unset):
            expires_at = UNSET
        elif isinstance(self.expires_at, datetime.datetime):
            expires_at = self.expires_at.isoformat()
        else:
            expires_at = self.expires_at

        expires_in_secs: int | None | Unset
        if isinstance(self.expires_in_secs, Unset):
            expires_in_secs = UNSET
        else:
            expires_in_secs = self.expires_in_secs

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "name": name,
            }
        )
        if expires_at is not UNSET:
            field_dict["expires_at"] = expires_at
        if expires_in_secs is not UNSET:
            field_dict["expires_in_secs"] = expires_in_secs

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        name = d.pop("name")

        def _parse_expires_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                expires_at_type_0 = datetime.datetime.fromisoformat(data)

                return expires_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        expires_at = _parse_expires_at(d.pop("expires_at", UNSET))

        def _parse_expires_in_secs(data: object) -> int | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(int | None | Unset, data)

        expires_in_secs = _parse_expires_in_secs(d.pop("expires_in_secs", UNSET))

        create_key = cls(
            name=name,
            expires_at=expires_at,
            expires_in_secs=expires_in_secs,
        )

        return create_key
