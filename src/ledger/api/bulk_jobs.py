"""Confirmed bulk actions as jobs: single use, every item recorded, large ones
in the background with progress over SSE.

Confirming a preview (``ledger.bulk``) starts a job in the database
(``ledger_api.start_bulk_job``, the operator role's: a reader's or sensor's
confirmation is refused there). The job records the selection token's digest,
unique, so a preview is acted on once, by whichever server process gets the
confirmation first. Each campaign acted on is one item with its outcome. Up
to ``bulk_inline_max`` campaigns the request waits for the job and answers
what it did; above, the job runs in a task of this process and the request
answers 202 with the job's address: ``GET /bulk-jobs/{id}`` reads its
progress (every item's outcome once it ended), ``GET /bulk-jobs/{id}/events``
follows it as Server-Sent Events (``progress``, then ``done``), from any
server process. A job whose process stops mid-way stays ``running`` with its
items so far: what was done is recorded, nothing is done twice.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from ledger import bulk
from ledger.api import problems
from ledger.api.roles import CallerDep
from ledger.db.kernel import Kernel
from ledger.db.reads import Reads
from ledger.errors import NotFound
from ledger.logs import get_logger

if TYPE_CHECKING:
    from ledger.api.state import ApiState

log = get_logger("api")
router = APIRouter(tags=["campaigns"])

JobId = Annotated[str, Path(pattern=r"^job-[0-9a-f]{32}$", description="Bulk job id")]


class BulkItem(BaseModel):
    """One campaign of a bulk job and what became of it."""

    campaign_id: int
    outcome: str


class BulkJob(BaseModel):
    """A confirmed bulk action: its progress, and every item once it ended."""

    id: str
    action: Literal["abandon", "reopen"]
    operator: str
    state: Literal["running", "done", "failed"]
    total: int = Field(description="Campaigns it acts on")
    done: int = Field(description="Campaigns acted on so far")
    outcomes: dict[str, int]
    not_previewed: list[int] = Field(default_factory=list)
    no_longer_matching: list[int] = Field(default_factory=list)
    items: list[BulkItem] | None = Field(description="Every item, once the job ended")


async def bulk_key(state: ApiState) -> bytes:
    """The key of selection tokens: the configured secret, else the database's own."""
    if state.bulk_key is None:
        kernel = await state.pools.kernel("operator")
        state.bulk_key = (await kernel.server_secret("bulk_selection")).encode()
    return state.bulk_key


async def confirm(state: ApiState, kernel: Kernel, reads: Reads, caller: str, action: str,
                  selector: bulk.Selector, previewed: list[int], token: str,
                  act: Callable[[int], Awaitable[object]], cap: int = bulk.DEFAULT_CAP,
                  ) -> bulk.Applied | str:
    """Act on a confirmed preview: what was done (``Applied``), or the id of the
    job that does it in the background."""
    planned = await bulk.plan(reads, action, selector, previewed, token,
                              key=await bulk_key(state), caller=caller, cap=cap)
    job_id = "job-" + secrets.token_hex(16)
    await kernel.start_bulk_job(job_id, bulk.token_digest(token), caller, action, planned.acting,
                                {"not_previewed": planned.not_previewed,
                                 "no_longer_matching": planned.no_longer_matching,
                                 "truncated": planned.truncated})

    async def record(cid: int, outcome: str) -> None:
        await kernel.record_bulk_item(job_id, cid, outcome)

    async def run() -> bulk.Applied:
        try:
            done = await bulk.act_on(planned, act, record)
        except BaseException:
            await asyncio.shield(kernel.finish_bulk_job(job_id, "failed"))
            raise
        await kernel.finish_bulk_job(job_id, "done")
        return done

    if len(planned.acting) <= state.options.bulk_inline_max:
        return await run()
    task = asyncio.create_task(run(), name=f"ledger-{job_id}")
    state.jobs[job_id] = task

    def finished(t: asyncio.Task[bulk.Applied]) -> None:
        state.jobs.pop(job_id, None)
        if not t.cancelled() and t.exception() is not None:
            log.warning("bulk job failed", job=job_id, error=repr(t.exception()))

    task.add_done_callback(finished)
    return job_id


def job_of(row: dict[str, Any]) -> BulkJob:
    """The API's view of a ``ledger_api.bulk_job`` row."""
    details = row.get("details") or {}
    return BulkJob(id=row["id"], action=row["action"], operator=row["operator"],
                   state=row["state"], total=row["total"], done=row["done"],
                   outcomes=row["outcomes"] or {},
                   not_previewed=list(details.get("not_previewed", [])),
                   no_longer_matching=list(details.get("no_longer_matching", [])),
                   items=None if row["items"] is None else
                   [BulkItem.model_validate(i) for i in row["items"]])


async def read_job(kernel: Kernel, job_id: str) -> BulkJob:
    """A job's progress; ``NotFound`` if there is no such job."""
    row = await kernel.bulk_job(job_id)
    if row is None:
        raise NotFound(f"there is no bulk job {job_id}")
    return job_of(row)


@router.get("/bulk-jobs/{job_id}", response_model=BulkJob,
            responses=problems.responses(401, 403, 404, 422, 503))
async def show_bulk_job(job_id: JobId, caller: CallerDep) -> BulkJob:
    """A bulk action's progress (operators only); every item once it ended."""
    return await read_job(caller.kernel, job_id)


@router.get("/bulk-jobs/{job_id}/events", response_class=EventSourceResponse,
            responses={200: {"description": "progress events, then done",
                             "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                       **problems.responses(401, 403, 404, 422, 503)})
async def bulk_job_events(request: Request, job_id: JobId, caller: CallerDep) -> EventSourceResponse:
    """Follow a bulk action: a ``progress`` event whenever more items are done,
    then ``done`` with every item's outcome."""
    first = await read_job(caller.kernel, job_id)  # refused before any byte is sent
    poll_s = request.app.state.ledger.options.poll_s

    async def events() -> AsyncIterator[ServerSentEvent]:
        job, seen = first, -1
        while True:
            if job.items is not None:  # the job ended
                yield ServerSentEvent(event="done", data=job.model_dump_json())
                return
            if job.done != seen:
                seen = job.done
                yield ServerSentEvent(event="progress", data=json.dumps(
                    {"done": job.done, "total": job.total, "outcomes": job.outcomes}))
            await asyncio.sleep(poll_s)  # the job's rows are the only signal: poll them
            job = await read_job(caller.kernel, job_id)

    return EventSourceResponse(events(), ping=0)
