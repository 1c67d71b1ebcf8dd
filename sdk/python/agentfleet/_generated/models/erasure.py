from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast
from uuid import UUID

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.erasure_counted_type_0 import ErasureCountedType0
    from ..models.erasure_deleted import ErasureDeleted
    from ..models.erasure_remaining_type_0 import ErasureRemainingType0


T = TypeVar("T", bound="Erasure")


@_attrs_define
class Erasure:
    """An erasure as recorded.

    Attributes:
        deleted (ErasureDeleted): Rows deleted so far, per table.
        keys_revoked (int): Keys revoked by the request (the others were revoked already).
        phase (str): `cancelling` (its runs not yet ended are being cancelled), `waiting`
            (`erasure.grace_ms` after the last cancel: cached keys of other replicas expire, workers
            stop), `deleting`, `verifying`, `done`.
        redis_keys_deleted (int): Redis keys deleted (the runs' event lists, fences and bases; the tenant's rate
            bucket).
        requested_at (datetime.datetime):
        runs_cancelled (int): Runs cancelled (queued, waiting or running when the erasure found them).
        status (str): `erasing` (rows or keys may remain) or `done` (verified: nothing of the tenant is left).
        tenant_id (UUID):
        updated_at (datetime.datetime):
        counted (ErasureCountedType0 | None | Unset): Rows per table when deletion began.
        finished_at (datetime.datetime | None | Unset):
        last_error (None | str | Unset): The last failure of a step (retried by the next holder of the erasure).
        quiet_since (datetime.datetime | None | Unset): When its last active run was cancelled; deletion begins
            `erasure.grace_ms` later.
        remaining (ErasureRemainingType0 | None | Unset): Rows per table left: counted when deletion began, less what
            was deleted since, and
            counted again by each verification; every table at 0 once `done` (the proof). Null
            before deletion begins.
        started_at (datetime.datetime | None | Unset): When a replica first worked on it.
        verified_at (datetime.datetime | None | Unset): When `remaining` was last counted by a verification (the proof's
            time once `done`).
    """

    deleted: ErasureDeleted
    keys_revoked: int
    phase: str
    redis_keys_deleted: int
    requested_at: datetime.datetime
    runs_cancelled: int
    status: str
    tenant_id: UUID
    updated_at: datetime.datetime
    counted: ErasureCountedType0 | None | Unset = UNSET
    finished_at: datetime.datetime | None | Unset = UNSET
    last_error: None | str | Unset = UNSET
    quiet_since: datetime.datetime | None | Unset = UNSET
    remaining: ErasureRemainingType0 | None | Unset = UNSET
    started_at: datetime.datetime | None | Unset = UNSET
    verified_at: datetime.datetime | None | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.erasure_counted_type_0 import ErasureCountedType0
        from ..models.erasure_remaining_type_0 import ErasureRemainingType0

        deleted = self.deleted.to_dict()

        keys_revoked = self.keys_revoked

        phase = self.phase

        redis_keys_deleted = self.redis_keys_deleted

        requested_at = self.requested_at.isoformat()

        runs_cancelled = self.runs_cancelled

        status = self.status

        tenant_id = str(self.tenant_id)

        updated_at = self.updated_at.isoformat()

        counted: dict[str, Any] | None | Unset
        if isinstance(self.counted, Unset):
            counted = UNSET
        elif isinstance(self.counted, ErasureCountedType0):
            counted = self.counted.to_dict()
        else:
            counted = self.counted

        finished_at: None | str | Unset
        if isinstance(self.finished_at, Unset):
            finished_at = UNSET
        elif isinstance(self.finished_at, datetime.datetime):
            finished_at = self.finished_at.isoformat()
        else:
            finished_at = self.finished_at

        last_error: None | str | Unset
        if isinstance(self.last_error, Unset):
            last_error = UNSET
        else:
            last_error = self.last_error

        quiet_since: None | str | Unset
        if isinstance(self.quiet_since, Unset):
            quiet_since = UNSET
        elif isinstance(self.quiet_since, datetime.datetime):
            quiet_since = self.quiet_since.isoformat()
        else:
            quiet_since = self.quiet_since

        remaining: dict[str, Any] | None | Unset
        if isinstance(self.remaining, Unset):
            remaining = UNSET
        elif isinstance(self.remaining, ErasureRemainingType0):
            remaining = self.remaining.to_dict()
        else:
            remaining = self.remaining

        started_at: None | str | Unset
        if isinstance(self.started_at, Unset):
            started_at = UNSET
        elif isinstance(self.started_at, datetime.datetime):
            started_at = self.started_at.isoformat()
        else:
            started_at = self.started_at

        verified_at: None | str | Unset
        if isinstance(self.verified_at, Unset):
            verified_at = UNSET
        elif isinstance(self.verified_at, datetime.datetime):
            verified_at = self.verified_at.isoformat()
        else:
            verified_at = self.verified_at

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "deleted": deleted,
                "keys_revoked": keys_revoked,
                "phase": phase,
                "redis_keys_deleted": redis_keys_deleted,
                "requested_at": requested_at,
                "runs_cancelled": runs_cancelled,
                "status": status,
                "tenant_id": tenant_id,
                "updated_at": updated_at,
            }
        )
        if counted is not UNSET:
            field_dict["counted"] = counted
        if finished_at is not UNSET:
            field_dict["finished_at"] = finished_at
        if last_error is not UNSET:
            field_dict["last_error"] = last_error
        if quiet_since is not UNSET:
            field_dict["quiet_since"] = quiet_since
        if remaining is not UNSET:
            field_dict["remaining"] = remaining
        if started_at is not UNSET:
            field_dict["started_at"] = started_at
        if verified_at is not UNSET:
            field_dict["verified_at"] = verified_at

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.erasure_counted_type_0 import ErasureCountedType0
        from ..models.erasure_deleted import ErasureDeleted
        from ..models.erasure_remaining_type_0 import ErasureRemainingType0

        d = dict(src_dict)
        deleted = ErasureDeleted.from_dict(d.pop("deleted"))

        keys_revoked = d.pop("keys_revoked")

        phase = d.pop("phase")

        redis_keys_deleted = d.pop("redis_keys_deleted")

        requested_at = datetime.datetime.fromisoformat(d.pop("requested_at"))

        runs_cancelled = d.pop("runs_cancelled")

        status = d.pop("status")

        tenant_id = UUID(d.pop("tenant_id"))

        updated_at = datetime.datetime.fromisoformat(d.pop("updated_at"))

        def _parse_counted(data: object) -> ErasureCountedType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                counted_type_0 = ErasureCountedType0.from_dict(data)

                return counted_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(ErasureCountedType0 | None | Unset, data)

        counted = _parse_counted(d.pop("counted", UNSET))

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

        def _parse_last_error(data: object) -> None | str | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            return cast(None | str | Unset, data)

        last_error = _parse_last_error(d.pop("last_error", UNSET))

        def _parse_quiet_since(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                quiet_since_type_0 = datetime.datetime.fromisoformat(data)

                return quiet_since_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        quiet_since = _parse_quiet_since(d.pop("quiet_since", UNSET))

        def _parse_remaining(data: object) -> ErasureRemainingType0 | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                remaining_type_0 = ErasureRemainingType0.from_dict(data)

                return remaining_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(ErasureRemainingType0 | None | Unset, data)

        remaining = _parse_remaining(d.pop("remaining", UNSET))

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

        def _parse_verified_at(data: object) -> datetime.datetime | None | Unset:
            if data is None:
                return data
            if isinstance(data, Unset):
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                verified_at_type_0 = datetime.datetime.fromisoformat(data)

                return verified_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None | Unset, data)

        verified_at = _parse_verified_at(d.pop("verified_at", UNSET))

        erasure = cls(
            deleted=deleted,
            keys_revoked=keys_revoked,
            phase=phase,
            redis_keys_deleted=redis_keys_deleted,
            requested_at=requested_at,
            runs_cancelled=runs_cancelled,
            status=status,
            tenant_id=tenant_id,
            updated_at=updated_at,
            counted=counted,
            finished_at=finished_at,
            last_error=last_error,
            quiet_since=quiet_since,
            remaining=remaining,
            started_at=started_at,
            verified_at=verified_at,
        )

        erasure.additional_properties = d
        return erasure

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
