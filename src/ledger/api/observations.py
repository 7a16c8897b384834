"""Sensor intake for external sensors: ``POST /observations``; ``GET /sensors``.

An observation is recorded and applied (open, regress, confirm, dismiss) by one
kernel call as the caller's role -- only a sensor token's role may. With an
``Idempotency-Key`` the kernel keeps the key and a digest of the request: the
same key with the same body returns the first result, with another body it is
refused (``idempotency-conflict``). The digest is SHA-256 of the validated body
as canonical JSON (sorted keys, no whitespace), so formatting and key order do
not make two equal requests differ.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query, Response
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ledger.api import problems
from ledger.api.campaigns import Name, Text
from ledger.api.roles import Caller, CallerDep
from ledger.db import bounds
from ledger.db.cursors import BIGINT_MAX
from ledger.db.models import Observation, ObservationRecorded, SensorSummary
from ledger.errors import InvalidInput, NotFound

router = APIRouter(tags=["observations"])

class ObservationIn(BaseModel):
    """What a sensor saw of a target."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    sensor: Name | None = Field(
        default=None, description="The sensor's name (default: http:<token name>)")
    objective_key: Text
    target: Text
    status: Literal["green", "red", "error"] = Field(
        description="green or red: what the target is; error: the check itself failed (say why in "
                    "details.error), which opens and closes nothing")
    started_at: AwareDatetime
    finished_at: AwareDatetime | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    class_: Name | None = Field(
        default=None, alias="class", description="Needed when a red observation opens a campaign")
    tick: AwareDatetime | None = Field(default=None, description="The schedule tick (one "
                                                                 "observation per sensor and tick)")
    desired_state: dict[str, Any] = Field(default_factory=dict)
    labels: list[Name] = Field(
        default_factory=list, max_length=50)
    open_after: int = Field(1, ge=1, le=100, description="Red observations in a row of this "
                                                         "objective before one opens a campaign")
    confirm_after: int = Field(1, ge=1, le=100, description="Green observations in a row before "
                                                            "one confirms or dismisses a campaign")

    @field_validator("details", "desired_state")
    @classmethod
    def _bounded_document(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # What a sensor stores every reader renders: bounded as the database
        # bounds it (ledger.bounds), refused here so the problem names the field.
        try:
            return bounds.check_document(info.field_name or "document", value)  # type: ignore[no-any-return]
        except InvalidInput as exc:
            raise ValueError(exc.message) from None

    @field_validator("started_at", "finished_at", "tick")
    @classmethod
    def _sane_instant(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        try:
            return bounds.check_instant(info.field_name or "instant", value)
        except InvalidInput as exc:
            raise ValueError(exc.message) from None

    def digest(self) -> str:
        """SHA-256 of this request as canonical JSON."""
        canonical = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True,
                               separators=(",", ":"), ensure_ascii=False)
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


@router.post("/observations", status_code=202, response_model=ObservationRecorded,
             responses=problems.responses(401, 403, 413, 422, 503))
async def record_observation(
    body: ObservationIn,
    caller: CallerDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(
        alias="Idempotency-Key", min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$",
        description="Retries with the same key and body return the first result")] = None,
) -> ObservationRecorded:
    """Record an observation and apply what it implies; 202 with its id and ``Location``.

    An unregistered ``class`` is invalid input (422), named as such."""
    try:
        recorded = await _record(body, caller, idempotency_key)
    except NotFound as exc:
        # The kernel's refusal is the observation's foreign key to the class;
        # say which class, rather than hand over PostgreSQL's message.
        if body.class_ is not None and not await _class_exists(caller, body.class_):
            raise InvalidInput(f"class {body.class_!r} is not registered (ledger classes "
                               "sync registers the classes of ledger.toml)") from exc
        raise
    response.headers["Location"] = f"/observations/{recorded.observation_id}"
    return recorded


async def _class_exists(caller: Caller, name: str) -> bool:
    try:
        await caller.reads.campaign_class(name)
    except NotFound:
        return False
    return True


async def _record(body: ObservationIn, caller: Caller,
                  idempotency_key: str | None) -> ObservationRecorded:
    return await caller.kernel.record_observation(
        body.sensor or caller.principal.identity, body.objective_key, body.target, body.status,
        body.started_at, finished_at=body.finished_at, details=body.details,
        class_=body.class_, tick=body.tick, idempotency_key=idempotency_key,
        request_digest=body.digest() if idempotency_key else None,
        desired_state=body.desired_state, labels=body.labels,
        open_after=body.open_after, confirm_after=body.confirm_after,
    )


@router.get("/observations/{observation_id}", response_model=Observation,
            responses=problems.responses(401, 404, 422, 503))
async def show_observation(
    observation_id: Annotated[int, Path(ge=1, le=BIGINT_MAX)], caller: CallerDep,
) -> Observation:
    """One recorded observation."""
    return await caller.reads.observation(observation_id)


@router.get("/sensors", response_model=list[SensorSummary],
            responses=problems.responses(401, 422, 503))
async def list_sensors(
    caller: CallerDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[SensorSummary]:
    """Every sensor that recorded or claimed anything (by name, at most
    ``limit``): its latest outcome (green, red or error), its errors in a row
    and its latest error's reason."""
    return await caller.reads.sensor_summaries(limit)
