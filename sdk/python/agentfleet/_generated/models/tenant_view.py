from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.tenant_info_limits import TenantInfoLimits
    from ..models.tenant_info_retention import TenantInfoRetention
    from ..models.tenant_view_effective_limits import TenantViewEffectiveLimits
    from ..models.tenant_view_effective_retention import TenantViewEffectiveRetention


T = TypeVar("T", bound="TenantView")


@_attrs_define
class TenantView:
    """A tenant with the limits and retention windows that apply to it.

    Attributes:
        created_at (datetime.datetime):
        id (UUID):
        limits (TenantInfoLimits): Only the limits set for this tenant; absent ones are the configured `[limits]`.
        name (str):
        retention (TenantInfoRetention): Only the retention windows set for this tenant; absent ones are the configured
            `[retention]`.
        effective_limits (TenantViewEffectiveLimits): Its own limits over the configured `[limits]` (0 = no limit).
        effective_retention (TenantViewEffectiveRetention): Its own retention windows over the configured `[retention]`,
            in seconds (0 = kept for
            ever).
        erased_at (datetime.datetime | None | Unset): Set when its erasure was requested (`DELETE
            /admin/v1/tenants/{id}`): its keys are
            refused, its data is being (or has been) removed, and the row stays as a tombstone
            (`GET /admin/v1/tenants/{id}/erasure`).
        suspended_at (datetime.datetime | None | Unset): Set while the tenant is suspended: its keys may read and
            cancel, nothing new starts.
    """

    created_at: datetime.datetime
    id: UUID
    limits: TenantInfoLimits
    name: str
    retention: TenantInfoRetention
    effective_limits: TenantViewEffectiveLimits
    effective_retention: TenantViewEffectiveRetention
    erased_at: datetime.datetime | None | Unset = UNSET
    suspended_at: datetime.datetime | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        created_at = self.created_at.isoformat()

        id = str(self.id)

        limits = self.limits.to_dict()

        name = self.name

        retention = self.retention.to_dict()

        effective_limits = self.effective_limits.to_dict()

        effective_retention = self.effective_retention.to_dict()

        erased_at: None | str | Unset
        if isinstance(self.erased_at, Unset):
            erased_at = UNSET
        elif isinstance(self.erased_at, datetime.datetime):
            erased_at = self.erased_at.isoformat()
        else:
            erased_at = self.erased_at

        suspended_at: None | str | Unset
        if isinstance(self.suspended_at, Unset):
            suspended_at = UNSET
        elif isinstance(self.suspended_at, datetime.datetime):
            suspended_at = self.suspended_at.isoformat()
        else:
            suspended_at = self.suspended_at

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "created_at": created_at,
                "id": id,
                "limits": limits,
                "name": name,
                "retention": retention,
                "effective_limits": effective_limits,
                "effective_retention": effective_retention,
            }
        )
        if erased_at is not UNSET:
            field_dict["erased_at"] = erased_at
        if suspended_at is not UNSET:
            field_dict["suspended_at"] = suspended_at

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.tenant_info_limits import TenantInfoLimits
        from ..models.tenant_info_retention import TenantInfoRetention
        from ..models.tenant_view_effective_limits import TenantViewEffectiveLimits
        from ..models.tenant_view_effective_retention import (
            TenantViewEffectiveRetention,
        )

        d = dict(src_dict)
        created_at = datetime.datetime.fromisoformat(d.pop("created_at"))

        id = UUID(d.pop("id"))

        limits = TenantInfoLimits.from_dict(d.pop("limits"))

        name = d.pop("name")

        retention = TenantInfoRetention.from_dict(d.pop("retention"))

        effective_limits = TenantViewEffectiveLimits.from_dict(
            d.pop("effective_limits")
        )

        effective_retention = TenantViewEffectiveRetention.from_dict(
            d.pop("effective_retention")
        )

        def _parse_erased_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                erased_at_type_0 = datetime.datetime.fromisoformat(data)

                return erased_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        erased_at = _parse_erased_at(d.pop("erased_at", UNSET))

        def _parse_suspended_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                suspended_at_type_0 = datetime.datetime.fromisoformat(data)

                return suspended_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        suspended_at = _parse_suspended_at(d.pop("suspended_at", UNSET))

        tenant_view = cls(
            created_at=created_at,
            id=id,
            limits=limits,
            name=name,
            retention=retention,
            effective_limits=effective_limits,
            effective_retention=effective_retention,
            erased_at=erased_at,
            suspended_at=suspended_at,
        )

        tenant_view.additional_properties = d
        return tenant_view

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
