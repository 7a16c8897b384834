"""``ledger demo``: one campaign through the kernel, narrated.

On the embedded default it uses a throwaway database (``ledger_demo``,
recreated on every run) so the demo is repeatable and leaves the real
``ledger`` database alone.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from rich.console import Console

from . import migrations
from .database import Database, Session
from .embedded import server_url, with_database
from .kernel import Kernel
from .settings import Settings

DEMO_DATABASE = "ledger_demo"
DEMO_CLASS = "demo"


def prepare_database(settings: Settings) -> Database:
    """A migrated database for the demo."""
    if settings.database_url:
        url = settings.database_url
    else:
        import psycopg
        from psycopg import sql

        admin = server_url(settings.data_dir)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(DEMO_DATABASE)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DEMO_DATABASE)))
        url = with_database(admin, DEMO_DATABASE)
    migrations.upgrade(url, settings.role_prefix)
    return Database(url, role_prefix=settings.role_prefix, role_urls=settings.role_urls())


class Timeline:
    """Prints what happens, with the time since the start."""

    def __init__(self, console: Console):
        self.console = console
        self.start = time.monotonic()

    def step(self, what: str, detail: str = "") -> None:
        elapsed = time.monotonic() - self.start
        self.console.print(f"[dim]{elapsed:6.2f}s[/]  [bold]{what:<12}[/] {detail}", highlight=False)


@asynccontextmanager
async def _sessions(db: Database, *actors: str) -> AsyncIterator[dict[str, Session]]:
    sessions = {actor: await db.session(actor, max_size=2).open() for actor in actors}
    try:
        yield sessions
    finally:
        for session in sessions.values():
            await session.close()


async def run_demo(settings: Settings, console: Console) -> int:
    """Run the demo; returns the process exit code."""
    timeline = Timeline(console)
    db = prepare_database(settings)
    timeline.step("migrated", f"schema {migrations.current(db.url)}")
    async with _sessions(db, "operator", "sensor", "worker", "verifier", "reader") as s:
        operator, sensor, worker = Kernel(s["operator"]), Kernel(s["sensor"]), Kernel(s["worker"])
        verifier, reader = Kernel(s["verifier"]), Kernel(s["reader"])
        await operator.register_class(DEMO_CLASS, max_attempts=3, lease_seconds=30)
        opened = await sensor.open_campaign(DEMO_CLASS, "tests-pass:demo-repo", "demo-repo",
                                            observation={"status": "red", "failing": 1},
                                            sensor="demo-sensor")
        timeline.step("opened", f"campaign {opened.campaign_id} (as {db.role('sensor')})")
        claim = await worker.claim_campaign("demo-worker")
        assert claim is not None
        timeline.step("leased", f"by demo-worker, generation {claim.generation}, "
                                f"lease until {claim.lease_expires_at:%H:%M:%S}")
        await worker.heartbeat(claim.campaign_id, claim.generation)
        timeline.step("heartbeat", "lease rolled forward (fenced by generation)")
        attempt = await worker.record_attempt(
            claim.campaign_id, claim.generation, base_sha="0" * 40, candidate_sha="c0ffee" + "0" * 34,
            fingerprint="sha256:" + "ab" * 16)
        timeline.step("attempted", f"attempt {attempt} recorded a candidate")
        check = await verifier.claim_verification("demo-verifier", model_family="demo")
        assert check is not None
        await verifier.accept(check.verification_id, {"checks": "passed"})
        timeline.step("verified", f"by demo-verifier (as {db.role('verifier')}), not by the worker")
        console.print()
        console.print("[bold]journal[/]")
        for event in await reader.events(opened.campaign_id):
            what = event.payload.get("transition") or event.type
            frm, to = event.payload.get("from"), event.payload.get("to")
            move = f"{frm or '-'} -> {to}" if to else ""
            console.print(f"  {event.seq:>3}  {what:<16} {move:<24} by {event.actor}", highlight=False)
        final = await reader.campaign(opened.campaign_id)
        console.print(f"\ncampaign {final.id} is [bold]{final.state}[/]")
    return 0
