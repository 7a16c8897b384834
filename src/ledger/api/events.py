"""A campaign's journal as Server-Sent Events: ``GET /campaigns/{id}/events``.

Each journal event is one SSE event: ``id:`` is its ``seq``, ``event:`` its
type, ``data:`` the event as JSON. A client that reconnects sends the last id
it saw as ``Last-Event-ID`` (or, the first time, ``?from=<seq>``) and gets
every later event exactly once, in order. The stream ends after the terminal
transition; a client resuming at or after it gets ``204 No Content``, which
tells an ``EventSource`` to stop reconnecting. A cursor beyond the journal's
head of an open campaign (a journal it never saw: another database, a client
bug) is refused with a ``cursor-beyond-end`` problem naming the head, rather
than waiting silently for seqs that may never come. While nothing happens a comment
line goes out every ``keepalive_s`` so proxies keep the connection open.

The stream is ``ledger.tail`` over this process's hub: the cursor is the only
state, so any server process can serve any stream, and a reconnect may land on
another process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from ledger.api import problems
from ledger.api.campaigns import CampaignId
from ledger.api.problems import CursorBeyondEnd
from ledger.api.roles import CallerDep
from ledger.db.bounds import is_ascii_int
from ledger.db.cursors import BIGINT_MAX
from ledger.errors import InvalidInput
from ledger.tail import Keepalive, TailItem, tail

router = APIRouter(tags=["campaigns"])


def _cursor(last_event_id: str | None, from_: int | None) -> int:
    """Where to resume: ``Last-Event-ID`` (a reconnect) wins over ``?from=``."""
    if last_event_id is not None and last_event_id.strip():
        text = last_event_id.strip()
        # ASCII digits only: str.isdigit() takes '²', which int() refuses.
        if not is_ascii_int(text) or int(text) > BIGINT_MAX:
            raise InvalidInput("Last-Event-ID must be a journal seq (a non-negative integer)")
        return int(text)
    return from_ or 0


async def _frames(items: AsyncIterator[TailItem]) -> AsyncIterator[ServerSentEvent]:
    async with aclosing(items):  # type: ignore[type-var]
        async for item in items:
            if isinstance(item, Keepalive):
                yield ServerSentEvent(comment=f"keepalive seq={item.seq}")
            else:
                yield ServerSentEvent(data=item.model_dump_json(by_alias=True),
                                      event=item.type, id=str(item.seq))


@router.get(
    "/campaigns/{campaign_id}/events",
    response_class=EventSourceResponse,
    responses={200: {"description": "The journal, as Server-Sent Events",
                     "content": {"text/event-stream": {"schema": {"type": "string"}}}},
               204: {"description": "Nothing after the cursor: the campaign is closed"},
               **problems.responses(401, 404, 422, 503)},
)
async def campaign_events(
    request: Request,
    campaign_id: CampaignId,
    caller: CallerDep,
    from_: Annotated[int | None, Query(alias="from", ge=0, le=BIGINT_MAX,
                                       description="Resume after this seq")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
) -> Response:
    """Follow a campaign's journal until it closes."""
    after = _cursor(last_event_id, from_)
    campaign = await caller.reads.campaign(campaign_id)  # NotFound before any byte is sent
    if campaign.is_terminal and after >= campaign.event_seq:
        return Response(status_code=204)
    if after > campaign.event_seq:
        raise CursorBeyondEnd(f"the cursor {after} is beyond the end of campaign "
                              f"{campaign_id}'s journal (its last seq is {campaign.event_seq}); "
                              f"resume from {campaign.event_seq} or less")
    api = request.app.state.ledger
    items = tail(caller.reads, api.hub, campaign_id, after=after,
                 keepalive_s=api.options.keepalive_s, poll_s=api.options.poll_s)
    # ping=0: keepalives come from the tail (comments), not from a second timer.
    # (sse-starlette sets Cache-Control: no-store and X-Accel-Buffering: no.)
    return EventSourceResponse(_frames(items), ping=0)
