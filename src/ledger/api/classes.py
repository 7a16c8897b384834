"""Operator controls outside one campaign: pausing and resuming a class, and
the registry of processes (the workers view).

Pausing a class makes every claim skip it from the moment it commits;
attempts in flight finish, and their verification and promotion go on. The
pause and the resume are journaled in the class's own journal with
``http:<token name>``. A reader's or sensor's call is refused by the database
(403), as every write is.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path
from pydantic import BaseModel, ConfigDict, Field

from ledger.api import problems
from ledger.api.campaigns import NO_NUL
from ledger.api.roles import CallerDep
from ledger.db.models import ClassEvent, ClassPause, ProcessRow

router = APIRouter(tags=["classes"])

ClassName = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$",
                                description="Campaign class name")]


class PauseRequest(BaseModel):
    """Why a class is paused (kept in the class's journal)."""

    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str | None, Field(max_length=1000, pattern=NO_NUL)] = None


class ClassJournal(BaseModel):
    """What operators did to a class, newest first."""

    items: list[ClassEvent]


class Processes(BaseModel):
    """The registry of processes: the live first."""

    items: list[ProcessRow]


@router.post("/classes/{name}/pause", response_model=ClassPause,
             responses=problems.responses(401, 403, 404, 422, 503))
async def pause_class(name: ClassName, caller: CallerDep,
                      body: Annotated[PauseRequest | None, Body()] = None) -> ClassPause:
    """Pause a class: workers claim none of its campaigns; attempts in flight
    finish. Pausing a paused class changes nothing (`changed` is false)."""
    reason = (body or PauseRequest()).reason
    return await caller.kernel.pause_class(name, reason, caller.principal.identity)


@router.post("/classes/{name}/resume", response_model=ClassPause,
             responses=problems.responses(401, 403, 404, 422, 503))
async def resume_class(name: ClassName, caller: CallerDep) -> ClassPause:
    """Resume a paused class: its campaigns are claimed again."""
    return await caller.kernel.resume_class(name, caller.principal.identity)


@router.get("/classes/{name}/events", response_model=ClassJournal,
            responses=problems.responses(401, 404, 422, 503))
async def class_events(name: ClassName, caller: CallerDep) -> ClassJournal:
    """The class's journal: pauses and resumes, who and why (the last 100)."""
    await caller.reads.campaign_class(name)  # 404 for a class that is not registered
    return ClassJournal(items=await caller.reads.class_events(name, 100))


@router.get("/processes", response_model=Processes, tags=["status"],
            responses=problems.responses(401, 503))
async def processes(caller: CallerDep) -> Processes:
    """Every process of the registry: role, host, pid, since when, last seen,
    what it holds, and whether it is live, stopped or gone."""
    return Processes(items=await caller.reads.processes())
