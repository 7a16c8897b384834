"""The limits view (docs/limits.md): each key's leases and verifications
against its caps and today's spend, each rate bucket's rates and how long a
claim would wait on it, usage per class, the latest changes and who made
them. Read-only: limits are changed with ``ledger limits`` or the API."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from ledger.api.dashboard.render import pages_of
from ledger.api.dashboard.viewer import viewer_of

router = APIRouter()

#: How often the page refreshes itself.
REFRESH_S = 5


@router.get("/limits", response_class=HTMLResponse)
async def limits(request: Request) -> Response:
    """Caps, buckets, usage."""
    viewer = await viewer_of(request)
    reads = viewer.reads
    return pages_of(request).page(request, "limits.html", viewer, keys=await reads.limit_keys(),
                                  buckets=await reads.limit_buckets(), usage=await reads.usage_by_class(),
                                  events=await reads.limit_events(20), waiting=await reads.limits_waiting(),
                                  refresh_s=REFRESH_S)
