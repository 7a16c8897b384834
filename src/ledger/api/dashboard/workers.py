"""The workers view: every process of the registry (``ledger.runtime.registry``) --
which role, where, since when, when last seen, what it holds now and since
when -- live ones first; a process that stopped reporting shows as gone."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ledger.api.dashboard.render import pages_of
from ledger.api.dashboard.viewer import viewer_of
from ledger.db.models import ProcessRow

router = APIRouter()

#: How often the page refreshes itself (the registry changes on ticks, not events).
REFRESH_S = 5


def parse_since(held: dict[str, Any]) -> datetime | None:
    """When a process began holding something (the ISO time it reported), if it said."""
    try:
        return datetime.fromisoformat(str(held.get("since")))
    except ValueError:
        return None


@router.get("/workers", response_class=HTMLResponse)
async def workers(request: Request) -> Response:
    """The registry of processes."""
    viewer = await viewer_of(request)
    rows: list[ProcessRow] = await viewer.reads.processes()
    counts = {status: sum(1 for r in rows if r.status == status)
              for status in ("live", "gone", "stopped")}
    return pages_of(request).page(request, "workers.html", viewer, processes=rows,
                                  counts=counts, now=datetime.now(timezone.utc),
                                  since=parse_since, refresh_s=REFRESH_S)
