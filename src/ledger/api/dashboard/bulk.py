"""Bulk abandon and reopen: a preview of exactly what would be acted on, then a
confirmation that acts on those campaigns only (``ledger.bulk``).

The confirmation form carries the previewed ids and their selection token;
campaigns that match by the time it is posted but were not previewed are
shown, not acted on, as are previewed ones that no longer match."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ledger import bulk as bulk_actions
from ledger.api import bulk_jobs
from ledger.api.dashboard.campaign import extra_attempts
from ledger.api.dashboard.filters import BoardFilter
from ledger.api.dashboard.render import pages_of, redirect
from ledger.api.dashboard.viewer import Viewer, read_form, viewer_of
from ledger.db.bounds import is_ascii_int
from ledger.db.models import Campaign
from ledger.db.reads import Reads
from ledger.errors import InvalidInput

router = APIRouter()

SAMPLE = 20
_IDS_LIMIT = bulk_actions.DEFAULT_CAP


async def _campaigns(reads: Reads, ids: list[int]) -> list[Campaign]:
    return list(await asyncio.gather(*(reads.campaign(cid) for cid in ids)))


def _ids(text: str | None) -> list[int]:
    parts = [p for p in (text or "").split(",") if p.strip()]
    if len(parts) > _IDS_LIMIT or not all(is_ascii_int(p.strip()) for p in parts):
        raise InvalidInput("the previewed campaign ids are not a list of ids")
    return [int(p) for p in parts]


def _render_preview(request: Request, viewer: Viewer, action: str, flt: BoardFilter,
                    selection: bulk_actions.Selection, sample: list[Campaign], *,
                    status: int = 200, applied: bulk_actions.Applied | None = None,
                    changes: dict[str, list[Campaign]] | None = None) -> Response:
    return pages_of(request).page(
        request, "bulk.html", viewer, status=status, action=action, flt=flt,
        ids=list(selection.ids), token=selection.token, truncated=selection.truncated,
        sample=sample, cap=bulk_actions.DEFAULT_CAP, applied=applied, changes=changes or {},
        states=bulk_actions.action_states(action))


async def _select(request: Request, viewer: Viewer, action: str,
                  flt: BoardFilter) -> bulk_actions.Selection:
    state = request.app.state.ledger
    return await bulk_actions.select(viewer.reads, action, flt.selector(),
                                     key=await bulk_jobs.bulk_key(state),
                                     caller=viewer.principal.identity,
                                     ttl_s=state.options.bulk_token_ttl_s)


@router.get("/bulk/{action}", response_class=HTMLResponse)
async def preview(request: Request, action: str) -> Response:
    """What a bulk action would act on (nothing is done)."""
    viewer = await viewer_of(request)
    flt = BoardFilter.from_query(request)
    selection = await _select(request, viewer, action, flt)
    sample = await _campaigns(viewer.reads, list(selection.ids[:SAMPLE]))
    return _render_preview(request, viewer, action, flt, selection, sample)


@router.post("/bulk/{action}", response_class=HTMLResponse)
async def confirm(request: Request, action: str) -> Response:
    """Act on the previewed campaigns that still match, and on nothing else."""
    viewer = await viewer_of(request)
    form = await read_form(request, viewer)
    flt = BoardFilter.parse(form.get, form.get_all)
    identity = viewer.principal.identity
    k, reads = viewer.kernel, viewer.reads
    if action == "abandon":
        reason = (form.get("reason") or "").strip()[:1000] or "abandoned by operator"

        async def act(cid: int) -> object:
            return await k.abandon(cid, reason, identity)
    else:
        extra = extra_attempts(form.get("extra_attempts"))

        async def act(cid: int) -> object:
            return await k.reopen(cid, identity, extra)

    done = await bulk_jobs.confirm(request.app.state.ledger, k, reads, identity, action,
                                   flt.selector(), _ids(form.get("ids")),
                                   form.get("selection") or "", act)
    if isinstance(done, str):
        return redirect(request, "/ui/?" + flt.query(),
                        f"Bulk {action} on {flt.describe()} runs in the background "
                        f"(job {done}: GET /bulk-jobs/{done}/events follows it).")
    message = f"Bulk {action} on {flt.describe()}: {done.summary()}."
    if not done.changed:
        return redirect(request, "/ui/?" + flt.query(), message)
    # What matches is not what was previewed: say what differed, and offer a
    # fresh preview of what matches now.
    now = await _select(request, viewer, action, flt)
    changes = {"not_previewed": await _campaigns(reads, done.not_previewed[:SAMPLE]),
               "no_longer_matching": await _campaigns(reads, done.no_longer_matching[:SAMPLE])}
    sample = await _campaigns(reads, list(now.ids[:SAMPLE]))
    return _render_preview(request, viewer, action, flt, now, sample,
                           status=200 if done.acted_on else 409, applied=done,
                           changes=changes)
