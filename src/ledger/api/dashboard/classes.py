"""The per-class view: one class's configuration (what the database judges and,
where the server has its ``ledger.toml``, how workers attempt it), its
campaigns by state, attempts and verdicts over the last hour or day, time from
open to confirm (p50/p95), exhausted and oldest ready; pausing and resuming it;
and the list of classes."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ledger.api.charts import hour_chart
from ledger.api.dashboard.board import WINDOWS, activity, bucket_labels, window_of
from ledger.api.dashboard.render import STATES, pages_of, redirect
from ledger.api.dashboard.viewer import local_path, read_form, viewer_of
from ledger.errors import InvalidInput

router = APIRouter()

CONFIRM_DAYS = 7


def _check_name(name: str) -> None:
    if len(name) > 63 or "\x00" in name:
        raise InvalidInput("a class name has at most 63 characters")


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
    _check_name(name)
    viewer = await viewer_of(request)
    pages = pages_of(request)
    window = window_of(request)
    k = viewer.reads
    summary = await k.class_summary(name, CONFIRM_DAYS)
    cls, rows, journal = await asyncio.gather(
        k.campaign_class(name), activity(pages, k, name, window), k.class_events(name, 20))
    labels = bucket_labels(rows)
    charts = [
        hour_chart(f"Attempts per {window.per}", labels, [
            ("claims", "attempts started", [r.claims for r in rows]),
            ("ended", "attempts ended", [r.attempts_ended for r in rows])]),
        hour_chart(f"Verdicts per {window.per}", labels, [
            ("accepted", "accepted", [r.accepted for r in rows]),
            ("rejected", "rejected", [r.rejected for r in rows])]),
    ]
    configured = pages.config.classes.get(name) if pages.config is not None else None
    return pages.page(
        request, "class.html", viewer, cls=cls, summary=summary, configured=configured,
        has_config=pages.config is not None, journal=journal, now=datetime.now(timezone.utc),
        counts={s: summary.states.get(s, 0) for s in STATES}, charts=charts, window=window,
        windows=WINDOWS,
        totals={"attempts": sum(r.claims for r in rows),
                "accepted": sum(r.accepted for r in rows),
                "rejected": sum(r.rejected for r in rows)})


@router.post("/classes/{name}/pause")
async def pause(request: Request, name: str) -> Response:
    """Pause a class: workers claim nothing of it; attempts in flight finish."""
    _check_name(name)
    viewer = await viewer_of(request)
    form = await read_form(request, viewer)
    reason = (form.get("reason") or "").strip()[:1000] or None
    done = await viewer.kernel.pause_class(name, reason, viewer.principal.identity)
    said = (f"Class {name} paused: workers claim none of its campaigns; attempts in flight finish."
            if done.changed else f"Class {name} was paused already.")
    return redirect(request, local_path(form.get("next"), f"/ui/classes/{name}"), said)


@router.post("/classes/{name}/resume")
async def resume(request: Request, name: str) -> Response:
    """Resume a paused class."""
    _check_name(name)
    viewer = await viewer_of(request)
    form = await read_form(request, viewer)
    done = await viewer.kernel.resume_class(name, viewer.principal.identity)
    said = (f"Class {name} resumed: its campaigns are claimed again." if done.changed
            else f"Class {name} was not paused.")
    return redirect(request, local_path(form.get("next"), f"/ui/classes/{name}"), said)
