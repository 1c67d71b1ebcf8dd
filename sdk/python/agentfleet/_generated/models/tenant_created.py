from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.key_info import KeyInfo
    from ..models.tenant_view import TenantView


T = TypeVar("T", bound="TenantCreated")


@_attrs_define
class TenantCreated:
    """A new tenant and its first key (named `default`), whose secret is shown only here.

    Attributes:
        api_key (str):
        key (KeyInfo): One key as operators see it: never its secret or its hash.
        tenant (TenantView): A tenant with the limits and retention windows that apply to it.
    """

    api_key: str
    key: KeyInfo
    tenant: TenantView
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        api_key = self.api_key

        key = self.key.to_dict()

        tenant = self.tenant.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "api_key": api_key,
                "key": key,
                "tenant": tenant,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.key_info import KeyInfo
        from ..models.tenant_view import TenantView

        d = dict(src_dict)
        api_key = d.pop("api_key")

        key = KeyInfo.from_dict(d.pop("key"))

        tenant = TenantView.from_dict(d.pop("tenant"))

        tenant_created = cls(
            api_key=api_key,
            key=key,
            tenant=tenant,
        )

        tenant_created.additional_properties = d
        return tenant_created

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
