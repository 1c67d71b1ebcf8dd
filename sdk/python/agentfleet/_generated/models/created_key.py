from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.key_info import KeyInfo


T = TypeVar("T", bound="CreatedKey")


@_attrs_define
class CreatedKey:
    """A key just made: its description and the secret, shown this once.

    Attributes:
        api_key (str): The bearer secret; only its hash is kept, so it cannot be shown again.
        key (KeyInfo): One key as operators see it: never its secret or its hash.
    """

    api_key: str
    key: KeyInfo
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        api_key = self.api_key

        key = self.key.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "api_key": api_key,
                "key": key,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.key_info import KeyInfo

        d = dict(src_dict)
        api_key = d.pop("api_key")

        key = KeyInfo.from_dict(d.pop("key"))

        created_key = cls(
            api_key=api_key,
            key=key,
        )

        created_key.additional_properties = d
        return created_key

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
