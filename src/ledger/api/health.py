"""``/livez`` (the process answers) and ``/readyz`` (the database answers and its
schema serves this code: ledger.db.compatibility). Neither needs a token: load
balancers and orchestrators probe them.

A ready server may still be ``degraded`` (200, with the reasons): its hub does
not hear NOTIFY (wake-ups fall back to polling: LISTEN through a pooler),
campaigns wait on a system fault, processes of the fleet wait to start (their
host or configuration is not ready for them: ``ledger.runtime.startup``), or
the server's notification queue is over ``notify_queue_alarm`` full (a session
LISTENs but does not read; when it is full every NOTIFY fails)."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from pydantic import BaseModel

from ledger.api import problems
from ledger.db.compatibility import schema_state
from ledger.db.hub import queue_alarm
from ledger.db.reads import Reads
from ledger.errors import LedgerError, Unavailable
from ledger.logs import get_logger
from ledger.release import SCHEMA

log = get_logger("api")

router = APIRouter(tags=["health"])


class Health(BaseModel):
    """A probe's answer."""

    status: str
    revision: str | None = None
    head: str | None = None
    degraded: list[str] | None = None  # why a ready server is degraded


async def degradations(api: object) -> list[str]:
    """Why this ready server works less well than it should (empty: it does not)."""
    reasons: list[str] = []
    hub = getattr(api, "hub", None)
    if hub is not None and hub.deaf:
        reasons.append("the hub does not hear NOTIFY: wake-ups fall back to polling "
                       "(LISTEN needs a direct connection: LEDGER_LISTEN_DATABASE_URL)")
    threshold = api.options.notify_queue_alarm  # type: ignore[attr-defined]
    try:
        reads = Reads(await api.pools.session("reader"))  # type: ignore[attr-defined]
        usage = await reads.notify_queue_usage()
        waiting = await reads.waiting_counts()
        not_ready = await reads.processes_not_ready()
    except LedgerError:
        return reasons  # readiness itself was just read; a failed extra read is no verdict
    faults = [(n, age) for (_, reason), (n, age) in waiting.items() if reason == "system_fault"]
    if faults:
        # The probe is unauthenticated: counts only (the reasons name hosts:
        # `ledger show`, the dashboard and the logs have them).
        reasons.append(f"{sum(n for n, _ in faults)} campaign(s) wait on a system fault, the oldest "
                       f"for {max(age for _, age in faults):.0f}s: a fault that is not their attempts' "
                       "own (a git remote, the sandbox, a verifier's environment) holds them back; "
                       "nothing is charged, and they go on when it is fixed")
    if not_ready:
        # Counts only, as above: `ledger status` and the workers view say who and why.
        reasons.append(f"{len(not_ready)} process(es) wait to start: their host or their "
                       "configuration is not ready for them (no sandbox, a bad ledger.toml, a "
                       "repository that is not there ...); `ledger status` names them and why")
    alarmed = queue_alarm(usage, threshold)
    if alarmed:
        reasons.append(f"the notification queue is {usage:.0%} full (alarm above {threshold:.0%}): "
                       "a session LISTENs but does not read")
    if alarmed != api.queue_alarmed:  # type: ignore[attr-defined]
        api.queue_alarmed = alarmed  # type: ignore[attr-defined]
        if alarmed:
            log.warning("the server's notification queue is filling", usage=round(usage, 4),
                        threshold=threshold)
    return reasons


@router.get("/livez", response_model=Health)
async def livez() -> Health:
    """The process is up (it does not touch the database)."""
    return Health(status="alive")


@router.get("/readyz", response_model=Health, response_model_exclude_none=True,
            responses=problems.responses(503))
async def readyz(request: Request) -> Health:
    """The database is reachable and its schema serves this code (else 503);
    ``degraded`` with the reasons if it works less well than it should."""
    api = request.app.state.ledger
    try:
        # blocking reads: a worker thread, abandoned if it hangs
        with anyio.fail_after(api.options.ready_timeout_s):
            revision, problem = await anyio.to_thread.run_sync(schema_state, api.database.url,
                                                               abandon_on_cancel=True)
    except TimeoutError as exc:
        raise Unavailable("the database did not answer in time") from exc
    except Exception as exc:  # any failure to read the revision means: not ready
        # The probe is unauthenticated: the cause (hosts, users) goes to the log only.
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()),
                     type(exc).__name__)
        log.warning("not ready", error=first)
        raise Unavailable("the database is not reachable") from exc
    if problem is not None:
        raise Unavailable(problem.message + (f": {problem.hint}" if problem.hint else ""))
    head = SCHEMA
    reasons = await degradations(api)
    if reasons:
        return Health(status="degraded", revision=revision, head=head, degraded=reasons)
    return Health(status="ready", revision=revision, head=head)
