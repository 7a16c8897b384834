"""Journal tails: every event once, in seq order, from any cursor, to the end;
keepalives when idle; a synthetic end when resuming past it; the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest
import typer

from conftest import TEST_PREFIX, Actors
from drive import Driver, fingerprint
from ledger import Database
from ledger.cli.journal import parse_duration
from ledger.db.hub import Hub, NullHub
from ledger.db.models import Event
from ledger.errors import InvalidInput, NotFound
from ledger.tail import Keepalive, SyntheticEvent, TailItem, is_terminal, tail

pytestmark = pytest.mark.anyio

#: Long enough that only a NOTIFY can explain a prompt wake-up.
SLOW_POLL = 30.0


async def collect(items: AsyncIterator[TailItem], first: asyncio.Event | None = None,
                  ) -> list[TailItem]:
    """Everything a tail yields; ``first`` is set once it has yielded something."""
    out: list[TailItem] = []
    async with aclosing(items):  # type: ignore[type-var]
        async for item in items:
            out.append(item)
            if first is not None:
                first.set()
    return out


async def drive_to_abandoned(d: Driver, cid: int, during) -> None:
    """claim, append, fail, claim, append, abandon; ``during()`` runs midway."""
    worker, operator = await d.k("worker"), await d.k("operator")
    claim = await worker.claim_campaign("worker-1", [d.class_])
    assert claim is not None and claim.campaign_id == cid
    await worker.append_events(cid, claim.generation, [
        {"type": "attempt.started", "payload": {"n": 1}},
        {"type": "output", "payload": {"text": "line 1\n"}, "delta": True},
        {"type": "output", "payload": {"text": "line 2\n"}, "delta": True},
    ])
    await during()
    await worker.fail_attempt(cid, claim.generation, "tests still red", fingerprint=fingerprint(1))
    claim = await worker.claim_campaign("worker-2", [d.class_])
    assert claim is not None and claim.campaign_id == cid
    await worker.append_events(cid, claim.generation, [{"type": "attempt.started",
                                                         "payload": {"n": 2}}])
    await operator.abandon(cid, "not needed any more", "operator-1")


async def test_tails_before_during_after_and_resumed_see_each_event_once(db: Database, actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    reader = await actors.reads()
    cid = await d.open()
    async with Hub(db) as hub:
        def follow(after: int = 0) -> AsyncIterator[TailItem]:
            return tail(reader, hub, cid, after=after, poll_s=SLOW_POLL, keepalive_s=SLOW_POLL)

        started = asyncio.Event()
        before = asyncio.create_task(collect(follow(), started))
        await asyncio.wait_for(started.wait(), 5.0)  # it has read the journal: truly "before"
        during: list[asyncio.Task[list[TailItem]]] = []

        async def start_during() -> None:
            seen = asyncio.Event()
            during.append(asyncio.create_task(collect(follow(), seen)))
            await asyncio.wait_for(seen.wait(), 5.0)

        await drive_to_abandoned(d, cid, start_during)
        # Each live tail ends on its own at the terminal event; the claims never
        # NOTIFY and the poll is 30 s, so finishing in time shows the hub at work.
        live = await asyncio.wait_for(asyncio.gather(before, *during), 10.0)
        after = await asyncio.wait_for(collect(follow()), 10.0)
        resumed = await asyncio.wait_for(collect(follow(after=4)), 10.0)

    journal = await reader.events(cid)
    assert [e.seq for e in journal] == list(range(1, 10))
    assert [e.payload.get("transition") for e in journal if e.type == "transition"] == [
        "open", "claim", "fail_attempt", "claim", "abandon"]
    for seen in (*live, after):
        assert seen == journal  # every event, once, in seq order; no keepalives
    assert resumed == journal[4:]
    assert is_terminal(journal[-1]) and journal[-1].payload["to"] == "abandoned"
    assert not any(isinstance(e, SyntheticEvent) for e in (*live[0], *after, *resumed))


async def test_a_tail_catches_up_across_pages_and_stops_at_the_first_terminal_event(db: Database, actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid, gen = await d.leased()
    worker = await actors("worker")
    for batch in range(3):
        await worker.append_events(cid, gen, [{"type": "output", "payload": {"i": batch * 7 + i},
                                               "delta": True} for i in range(7)])
    await (await actors("operator")).abandon(cid)
    reader = await actors.reads()
    # Page size 4 cuts through batches; NullHub: nothing to wait for, it is all there.
    seen = await collect(tail(reader, NullHub(), cid, page_size=4, poll_s=0.01))
    assert [e.seq for e in seen] == list(range(1, 25))
    assert [e.payload["i"] for e in seen if e.type == "output"] == list(range(21))
    last = seen[-1]
    assert isinstance(last, Event) and is_terminal(last) and last.payload["to"] == "abandoned"


async def test_keepalives_mark_idle_time_and_carry_the_cursor(db: Database, actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid = await d.open()
    reader, operator = await actors.reads(), await actors("operator")
    items: list[TailItem] = []
    async with Hub(db) as hub:
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with aclosing(tail(reader, hub, cid, keepalive_s=0.1, poll_s=SLOW_POLL)) as stream:
            async for item in stream:
                items.append(item)
                if isinstance(item, Keepalive) and sum(isinstance(i, Keepalive) for i in items) == 2:
                    await operator.abandon(cid)
        elapsed = loop.time() - start
    assert [type(i) for i in items] == [Event, Keepalive, Keepalive, Event]
    first, k1, k2, last = items
    assert isinstance(k1, Keepalive) and isinstance(k2, Keepalive)
    assert k1.seq == k2.seq == first.seq == 1 and k1.campaign_id == cid
    assert k2.at > k1.at
    assert isinstance(last, Event) and last.seq == 2 and last.payload["to"] == "abandoned"
    # Two keepalive periods passed; the 30 s poll tick never did.
    assert 0.2 <= elapsed < 5.0


async def test_no_keepalives_without_follow(db: Database, actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid, _ = await d.leased()
    reader = await actors.reads()
    seen = await collect(tail(reader, NullHub(), cid, follow=False, keepalive_s=0.001))
    assert [(e.seq, e.payload["to"]) for e in seen] == [(1, "ready"), (2, "leased")]
    assert await collect(tail(reader, NullHub(), cid, after=2, follow=False)) == []


async def test_resuming_past_the_terminal_event_yields_a_synthetic_one(db: Database, actors: Actors, test_class: str) -> None:
    d = Driver(actors, test_class)
    cid, _ = await d.leased()
    operator, reader = await actors("operator"), await actors.reads()
    generation = await operator.abandon(cid, "enough")
    campaign = await reader.campaign(cid)
    assert campaign.event_seq == 3
    # From the terminal event itself: the real one, not a synthetic one.
    real = await collect(tail(reader, NullHub(), cid, after=2, poll_s=SLOW_POLL))
    assert len(real) == 1 and not isinstance(real[0], SyntheticEvent)
    for follow in (True, False):
        for after in (3, 99):
            seen = await asyncio.wait_for(
                collect(tail(reader, NullHub(), cid, after=after, follow=follow,
                             poll_s=SLOW_POLL)), 5.0)
            assert len(seen) == 1
            event = seen[0]
            assert isinstance(event, SyntheticEvent) and event.synthetic is True
            assert is_terminal(event) and event.payload["to"] == "abandoned"
            assert event.seq == after and event.generation == generation
            assert event.created_at == campaign.closed_at
            assert event.model_dump(mode="json")["synthetic"] is True


@pytest.mark.rollback  # only SQL: a transaction rolled back after the test
async def test_a_missing_campaign_and_a_bad_cursor_are_errors(actors: Actors) -> None:
    reader = await actors.reads()
    with pytest.raises(NotFound):
        await collect(tail(reader, NullHub(), 424242))
    with pytest.raises(InvalidInput, match="negative"):
        await collect(tail(reader, NullHub(), 1, after=-1))


# --- the command line ---------------------------------------------------------


def ledger_env(db_url: str) -> dict[str, str]:
    return {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
            "NO_COLOR": "1", "COLUMNS": "200"}


def ledger(db_url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ledger", *args], env=ledger_env(db_url),
                          capture_output=True, text=True, timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


async def _abandoned_with_deltas(actors: Actors, class_: str) -> int:
    d = Driver(actors, class_)
    cid, gen = await d.leased()
    await (await actors("worker")).append_events(cid, gen, [
        {"type": "output", "payload": {"text": "a"}, "delta": True},
        {"type": "attempt.started", "payload": {}},
        {"type": "output", "payload": {"text": "b"}, "delta": True},
    ])
    await (await actors("operator")).abandon(cid, "done here")
    return cid


async def test_cli_tail_and_trim(db_url: str, actors: Actors, test_class: str) -> None:
    cid = await _abandoned_with_deltas(actors, test_class)

    async def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(ledger, db_url, *args)

    # Independent invocations run side by side: each pays the interpreter's start-up.
    full, resumed, kept = await asyncio.gather(
        cli("tail", str(cid), "--no-follow", "--json"),
        cli("tail", str(cid), "--from", "4", "--no-follow"),
        cli("trim", "--older-than", "1h", "--json"),  # nothing has been closed that long
    )
    records = [json.loads(line) for line in full.stdout.splitlines()]
    assert [r["seq"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["type"] for r in records] == ["transition", "transition", "output",
                                            "attempt.started", "output", "transition"]
    assert records[1]["payload"]["from"] == "ready" and records[1]["actor"] == "worker-1"
    assert records[-1]["payload"]["to"] == "abandoned" and records[2]["delta"] is True
    assert "synthetic" not in records[-1]
    lines = resumed.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["5", "6"]
    assert "output" in lines[0] and '{"text": "b"}' in lines[0] and "worker-1" in lines[0]
    assert "abandon" in lines[1] and "leased→abandoned" in lines[1]
    assert json.loads(kept.stdout) == {"removed": 0, "older_than_s": 3600.0}

    trimmed = await cli("trim", "--older-than", "0s")
    assert trimmed.stdout.startswith("removed 2 delta events")
    remaining = await (await actors.reads("reader")).events(cid)
    assert [e.seq for e in remaining] == [1, 2, 4, 6]  # transitions and structure stay


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90s", "30m", "24h", "7d", "1.5h")] == [
        90, 1800, 86400, 604800, 5400]
    for bad in ("", "24", "1w", "-1h", "h"):
        with pytest.raises(typer.BadParameter):
            parse_duration(bad)


async def test_cli_tail_follows_until_the_campaign_closes(db_url: str, actors: Actors, test_class: str) -> None:
    cid = await Driver(actors, test_class).open()
    proc = subprocess.Popen([sys.executable, "-m", "ledger", "tail", str(cid), "--json"],
                            env=ledger_env(db_url), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        # The first line means the tail has subscribed and read the journal.
        first = await asyncio.to_thread(proc.stdout.readline)
        assert json.loads(first)["payload"]["to"] == "ready"
        await (await actors("operator")).abandon(cid)
        out, err = await asyncio.to_thread(proc.communicate, timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert [json.loads(line)["payload"]["to"] for line in out.splitlines()] == ["abandoned"]
