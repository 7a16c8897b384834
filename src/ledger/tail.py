"""Resumable journal tails (README "The command line": ``ledger tail``): a
stream is a table with a cursor.

``tail`` yields a campaign's journal events in ``seq`` order, each once, from
any cursor, through to the first terminal event, then stops. It subscribes to
the hub *before* every catch-up read, so an append committed between a read
and the wait still wakes it; and every wait is bounded by a poll tick, because
notifications are only hints: claims deliberately do not NOTIFY (journal.sql), and a
hub can be down. Any process can serve any tail: the cursor is the only state.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import datetime, timezone

from ledger.db.hub import WakeSource
from ledger.db.models import TERMINAL_STATES, Campaign, Event
from ledger.db.reads import Reads
from ledger.errors import InvalidInput

PAGE_SIZE = 500


@dataclass(frozen=True)
class Keepalive:
    """Nothing new for a while; ``seq`` is the cursor to resume from."""

    campaign_id: int
    seq: int
    at: datetime


class SyntheticEvent(Event):
    """A terminal transition made up from the campaign row, because the journal
    has none at or after the cursor (the tail resumed past it). ``seq`` is the
    cursor the tail stood at, not a journal row."""

    synthetic: bool = True


TailItem = Event | Keepalive


def is_terminal(event: Event) -> bool:
    """Whether ``event`` is the transition that closed its campaign."""
    return event.type == "transition" and event.payload.get("to") in TERMINAL_STATES


def _synthesise(campaign: Campaign, cursor: int) -> SyntheticEvent:
    return SyntheticEvent(
        campaign_id=campaign.id, seq=cursor, type="transition", actor="ledger",
        generation=campaign.generation, delta=False,
        payload={"transition": None, "from": None, "to": campaign.state,
                 "attempt_count": campaign.attempt_count},
        created_at=campaign.closed_at or campaign.updated_at,
    )


async def tail(
    reads: Reads,
    hub: WakeSource,
    campaign_id: int,
    *,
    after: int = 0,
    follow: bool = True,
    keepalive_s: float = 15.0,
    poll_s: float = 1.0,
    page_size: int = PAGE_SIZE,
) -> AsyncGenerator[TailItem, None]:
    """Yield the journal of ``campaign_id`` after seq ``after``, then (with
    ``follow``) what is appended, until and including the terminal transition.

    Items are ``Event``s (``seq`` is the resume cursor) and, when ``keepalive_s``
    passes without one, ``Keepalive``s. If the campaign is closed but its
    terminal transition lies before the cursor, a ``SyntheticEvent`` stands in
    for it. Without ``follow`` it yields what is there and stops.
    ``NotFound`` if there is no such campaign. A consumer that stops early
    should close the iterator (``contextlib.aclosing``) to end its subscription.
    """
    if after < 0:
        raise InvalidInput(f"the cursor must not be negative, not {after}")
    if keepalive_s <= 0 or poll_s <= 0 or page_size < 1:
        raise InvalidInput("keepalive_s, poll_s and page_size must be positive")
    loop = asyncio.get_running_loop()
    cursor = after
    quiet_since = loop.time()
    # One subscription for the whole tail, taken before the first read: a
    # notification between any read and the next wait is kept by its flag.
    with hub.subscribe("ledger_event", str(campaign_id)) as sub:
        while True:
            # The row first, then the journal: if the row was already closed,
            # its terminal event was committed before our read of the journal,
            # so not finding it there means it lies before the cursor.
            campaign = await reads.campaign(campaign_id)
            sub.drain()  # payloads are only this campaign's id: the wake is the news
            # event_seq is the journal's head (bumped with every append, in the
            # same transaction), so an idle tick costs this one row read.
            while campaign.event_seq > cursor:
                page = await reads.events(campaign_id, cursor, page_size)
                for event in page:
                    yield event
                    cursor = event.seq
                    quiet_since = loop.time()
                    if is_terminal(event):
                        return
                if len(page) < page_size:
                    break
            if campaign.is_terminal:
                yield _synthesise(campaign, cursor)
                return
            if not follow:
                return
            if loop.time() - quiet_since >= keepalive_s:
                yield Keepalive(campaign_id, cursor, datetime.now(timezone.utc))
                quiet_since = loop.time()
            # Woken or not, re-read: the poll tick is what makes a lost (or
            # never sent) notification cost latency only.
            await sub.wait(min(poll_s, max(quiet_since + keepalive_s - loop.time(), 0.0)))
