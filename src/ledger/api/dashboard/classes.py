"""The per-class view: one class's campaigns by state, attempts and verdicts per
hour, time from open to confirm (p50/p95), exhausted and oldest ready; and the
list of classes."""

from __future__ import annotations

import asyncio
from datetime import timezone

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ...errors import InvalidInput
from ..charts import hour_chart
from .render import STATES, pages_of
from .viewer import viewer_of

router = APIRouter()

HOURS = 24
CONFIRM_DAYS = 7


@router.get("/classes", response_class=HTMLResponse)
async def classes(request: Request) -> Response:
    """Every registered class with its campaigns per state."""
    viewer = await viewer_of(request)
    registered, counts = await asyncio.gather(viewer.reads.classes(),
                                              viewer.reads.class_state_counts())
    return pages_of(request).page(request, "classes.html", viewer, classes=registered,
                                  counts=counts)


@router.get("/classes/{name}", response_class=HTMLResponse)
async def class_page(request: Request, name: str) -> Response:
    """One class."""
    if len(name) > 63 or "\x00" in name:
        raise InvalidInput("a class name has at most 63 characters")
    viewer = await viewer_of(request)
    k = viewer.reads
    summary = await k.class_summary(name, CONFIRM_DAYS)
    cls, hourly = await asyncio.gather(k.campaign_class(name), k.hourly_activity(HOURS, name))
    hours = [r.hour.astimezone(timezone.utc).strftime("%H:00") for r in hourly]
    charts = [
        hour_chart("Attempts per hour", hours, [
            ("claims", "attempts started", [r.claims for r in hourly]),
            ("ended", "attempts ended", [r.attempts_ended for r in hourly])]),
        hour_chart("Verdicts per hour", hours, [
            ("accepted", "accepted", [r.accepted for r in hourly]),
            ("rejected", "rejected", [r.rejected for r in hourly])]),
    ]
    return pages_of(request).page(
        request, "class.html", viewer, cls=cls, summary=summary,
        counts={s: summary.states.get(s, 0) for s in STATES}, charts=charts, hours=HOURS,
        totals={"attempts": sum(r.claims for r in hourly),
                "accepted": sum(r.accepted for r in hourly),
                "rejected": sum(r.rejected for r in hourly)})
