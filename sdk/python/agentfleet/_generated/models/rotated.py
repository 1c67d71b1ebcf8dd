from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.key_info import KeyInfo


T = TypeVar("T", bound="Rotated")


@_attrs_define
class Rotated:
    """What a rotation did: the new key (same tenant and name) and the old one as it now stands.

    Attributes:
        api_key (str): The bearer secret; only its hash is kept, so it cannot be shown again.
        key (KeyInfo): One key as operators see it: never its secret or its hash.
        previous (KeyInfo): One key as operators see it: never its secret or its hash.
    """

    api_key: str
    key: KeyInfo
    previous: KeyInfo
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        api_key = self.api_key

        key = self.key.to_dict()

        previous = self.previous.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "api_key": api_key,
                "key": key,
                "previous": previous,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.key_info import KeyInfo

        d = dict(src_dict)
        api_key = d.pop("api_key")

        key = KeyInfo.from_dict(d.pop("key"))

        previous = KeyInfo.from_dict(d.pop("previous"))

        rotated = cls(
            api_key=api_key,
            key=key,
            previous=previous,
        )

        rotated.additional_properties = d
        return rotated

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
