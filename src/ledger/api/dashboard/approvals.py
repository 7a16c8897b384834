"""Approvals on the dashboard (docs/approval.md): the list of what waits for
a person, one approval's page -- the conditions that asked, the candidate's
diff, the verdicts with their evidence, the deadline -- and the decisions
posted from it (approve, deny), as the signed-in token's role."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ledger.api.dashboard.campaign import DIFF_CAP, check_id, diff_lines
from ledger.api.dashboard.render import pages_of, redirect
from ledger.api.dashboard.viewer import read_form, viewer_of
from ledger.errors import InvalidInput, NotFound

router = APIRouter()


@router.get("/approvals", response_class=HTMLResponse)
async def approvals_page(request: Request) -> Response:
    """Every candidate that waits for a person, oldest first."""
    viewer = await viewer_of(request)
    waiting = await viewer.reads.approvals_waiting(None, 500)
    return pages_of(request).page(request, "approvals.html", viewer, waiting=waiting,
                                  now=datetime.now(timezone.utc))


@router.get("/campaigns/{campaign_id}/approval", response_class=HTMLResponse)
async def approval_page(request: Request, campaign_id: int) -> Response:
    """A campaign's latest approval on one page: why it asks, the diff, the
    verdicts and their evidence, and (for an operator) the decision."""
    check_id(campaign_id)
    viewer = await viewer_of(request)
    k = viewer.reads
    campaign, approvals, attempts, verifications = await asyncio.gather(
        k.campaign(campaign_id), k.approvals_of(campaign_id), k.attempts_of(campaign_id),
        k.verifications_of(campaign_id))
    if not approvals:
        raise NotFound(f"campaign {campaign_id} was never asked for approval")
    approval = approvals[-1]
    attempt = next(a for a in attempts if a.id == approval.attempt_id)
    diff = (await k.attempt_diff(campaign_id, attempt.attempt_no, DIFF_CAP)
            if attempt.diff_bytes else None)
    return pages_of(request).page(
        request, "approval.html", viewer, c=campaign, ap=approval, a=attempt,
        verdicts=[v for v in verifications if v.attempt_id == attempt.id],
        diff=diff, diff_lines=diff_lines(diff.text) if diff else [],
        now=datetime.now(timezone.utc))


@router.post("/campaigns/{campaign_id}/approve")
async def approve(request: Request, campaign_id: int) -> Response:
    """Approve the candidate: its promotion is queued."""
    viewer = await viewer_of(request)
    form = await read_form(request, viewer)
    reason = (form.get("reason") or "").strip()[:4000] or None
    decided = await viewer.kernel.approve(campaign_id, viewer.principal.identity, reason)
    return redirect(request, f"/ui/campaigns/{campaign_id}/approval",
                    f"Campaign {campaign_id} approved: its promotion is queued"
                    + (f" (intent {decided.side_effect_id})." if decided.side_effect_id else "."))


@router.post("/campaigns/{campaign_id}/deny")
async def deny(request: Request, campaign_id: int) -> Response:
    """Deny the candidate: back to ready with the reason, or abandoned."""
    viewer = await viewer_of(request)
    form = await read_form(request, viewer)
    reason = (form.get("reason") or "").strip()[:4000]
    if not reason:
        raise InvalidInput("a denial needs a reason: the next attempt is told it")
    decided = await viewer.kernel.deny(campaign_id, viewer.principal.identity, reason,
                                       abandon=form.get("then") == "abandon")
    return redirect(request, f"/ui/campaigns/{campaign_id}/approval",
                    f"Campaign {campaign_id} denied: it is {decided.state} now.")
