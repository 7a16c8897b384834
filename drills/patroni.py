"""patroni: Ledger on a Patroni-managed cluster (``ledger.ops.patroni``: one etcd
member, two PostgreSQL members, ``synchronous_mode``). Every Ledger process --
two workers, a verifier, a dispatcher with git and HTTP side effects, a sensor
-- connects with one multi-host URL (``target_session_attrs=read-write``): no
proxy, libpq finds the leader. Under load, first a planned switchover
(``patronictl switchover``), then, once the old leader is back as the
synchronous standby, an unplanned failover (SIGKILL of the leader's postmaster
and its processes; Patroni lives on and, with ``primary_start_timeout: 0``,
hands the leader key to the synchronous standby instead of restarting in
place). After each: nothing acknowledged before the fault is missing, every
process acts on the new leader by itself, and the stall from the fault to the
first write on the new leader is measured; at the end what the failover drill
checks: nothing lost or doubled, one ending per generation, gap-free journals,
replay equals tables, every process still up and stopping cleanly."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from ledger.errors import LedgerError
from ledger.ops.drill import Drill, DrillContext, Proc, UnderExercised
from ledger.ops.patroni import Member, PatroniCluster

from . import fleet
from .failover import WORKER, Failover

ROLES = ("worker", "verifier", "dispatcher", "sensor")


def _quiet(read: Any, *args: Any) -> Any:
    """``read(*args)``, or ``None`` while the cluster is between leaders (the
    drill's own look underneath meets the fault too)."""
    try:
        return read(*args)
    except (LedgerError, psycopg.Error):
        return None


class Patroni(Drill):
    name = "patroni"
    summary = ("a patronictl switchover, then SIGKILL of the leader's postmaster, under load on a "
               "Patroni cluster -> every process follows the leader through its multi-host URL; "
               "nothing acknowledged is lost, nothing doubled; the stalls measured")
    patroni = True

    def timeout_s(self, scale: float, minutes: float | None) -> float:
        return 420.0 * max(scale, 1.0) ** 0.5

    async def run(self, ctx: DrillContext) -> None:
        cluster = ctx.patroni
        assert cluster is not None
        ctx.step(f"every process connects with: {cluster.url}")
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)  # the drill's own pools meet the faults too
        repo = await fleet.fleet_setup(ctx)
        target = fleet.Target()
        try:
            await self._run(ctx, cluster, repo, target)
        finally:
            target.close()

    async def _run(self, ctx: DrillContext, cluster: PatroniCluster, repo: Path, target: fleet.Target) -> None:
        procs = [ctx.spawn("worker-1", *WORKER), ctx.spawn("worker-2", *WORKER),
                 ctx.spawn("verifier", "verifier", "--poll", "0.5"),
                 ctx.spawn("dispatcher", "dispatcher", "--poll", "0.5", "--lease", "6", "--http-timeout", "1"),
                 ctx.spawn("sensor", "sensor", "run")]
        opened = fleet.Opened()
        stop = asyncio.Event()
        opener = asyncio.create_task(fleet.open_stream(ctx, opened, target, stop))
        stalls: dict[str, float] = {}
        try:
            loaded = await ctx.until(lambda: ctx.sql(
                "SELECT count(*) AS n FROM ledger.side_effect WHERE state = 'done'")[0]["n"] >= 4,
                "the fleet to be under load (promotions and HTTP calls done)", timeout=60 * max(ctx.scale, 1),
                interval=0.25)
            if not loaded:
                raise UnderExercised(f"the fleet never got going: {fleet.still_moving(ctx)}")

            leader, standby = await asyncio.to_thread(cluster.wait_healthy)
            stalls["switchover"] = await self._fault(
                ctx, cluster, procs, "switchover", leader, standby,
                lambda: cluster.switchover(leader, standby))
            ctx.step("waiting for the old leader to come back as the synchronous standby")
            leader, standby = await asyncio.to_thread(cluster.wait_healthy, 120 * max(ctx.scale, 1))
            ctx.expect(leader.name != standby.name, "the old leader rejoined as the synchronous standby",
                       f"leader {leader.name}, synchronous standby {standby.name}")
            await asyncio.sleep(3 * max(ctx.scale, 0.5))  # load on the new leader before the next fault

            stalls["failover"] = await self._fault(
                ctx, cluster, procs, "failover", leader, standby,
                lambda: f"{cluster.kill_postmaster(leader)} processes killed")
            await asyncio.sleep(5 * max(ctx.scale, 0.5))  # more load on the new leader
        finally:
            stop.set()
            await opener
        ctx.step(f"stopped opening: {len(opened.work)} objectives, {len(opened.notify)} HTTP campaigns "
                 f"({opened.refused} tries met an outage and were retried)")
        _, how = await fleet.settle(ctx, cap_s=90)
        ctx.step(how)
        figures = fleet.check(ctx, opened, target, repo)
        ctx.step(f"figures: {figures}; stalls (fault to the first write on the new leader): "
                 + ", ".join(f"{k} {v:.2f}s" for k, v in stalls.items()))
        ctx.expect(all(p.popen.poll() is None for p in procs), "no process exited",
                   str({p.name: p.popen.poll() for p in procs}))
        for p in procs:
            p.signal(signal.SIGTERM)
        codes = {p.name: p.wait(30) for p in procs}
        ctx.expect(set(codes.values()) == {0}, "every process stops cleanly", str(codes))

    async def _fault(self, ctx: DrillContext, cluster: PatroniCluster, procs: list[Proc], kind: str,
                     leader: Member, standby: Member, inject: Any) -> float:
        """Inject one fault (``inject``, blocking) with the fleet under load and
        check what must hold after it; returns the stall in seconds."""
        sync = ctx.sql("SELECT application_name, sync_state FROM pg_stat_replication")
        ctx.expect([r["sync_state"] for r in sync] == ["sync"],
                   f"before the {kind}: {leader.name} leads, {standby.name} replicates synchronously", str(sync))
        committed = {r["campaign_id"]: r["seq"] for r in ctx.sql(
            "SELECT campaign_id, max(seq) AS seq FROM ledger.campaign_event GROUP BY 1")}
        timeline = len(cluster.history())
        fault_at = datetime.now(UTC)
        began = time.monotonic()
        said = await asyncio.to_thread(inject)
        ctx.step(f"fault: {kind} of {leader.name} to {standby.name} ({said.splitlines()[-1] if said else ''}); "
                 f"{len(committed)} campaigns' journals read just before")
        led = await ctx.until(lambda: cluster.leader() is standby and len(cluster.history()) > timeline,
                              f"{standby.name} to lead", timeout=90, interval=0.1)
        ctx.expect(led, f"Patroni made {standby.name} the leader ({kind})",
                   f"{time.monotonic() - began:.2f}s after the fault; topology {cluster.topology()}")
        promoted_at = self._promoted_at(cluster, timeline)
        # The old leader took no write after the new one was promoted (stopped or
        # killed first): whatever the journal holds from then on was written there.
        first = await ctx.until(lambda: promoted_at is not None and _quiet(self._first_after, ctx, promoted_at),
                                "the fleet to write on the new leader", timeout=60, interval=0.1)
        ctx.expect(first, f"the fleet writes again on the new leader after the {kind}")
        first_at = self._first_after(ctx, promoted_at) if promoted_at else None
        stall = (first_at - fault_at).total_seconds() if first_at else float("nan")
        promotion = (promoted_at - fault_at).total_seconds() if promoted_at else float("nan")
        ctx.step(f"{kind}: the fleet stalled {stall:.2f}s from the fault to the first journal write on "
                 f"{standby.name} (Patroni promoted it {promotion:.2f}s after the fault)")
        for role in ROLES:
            assert promoted_at is not None
            got = await ctx.until(lambda role=role: _quiet(Failover._role_after, ctx, role, promoted_at),
                                  f"the {role} to act on the new leader", timeout=60, interval=0.25)
            acted = Failover._role_after(ctx, role, promoted_at)
            ctx.expect(got, f"after the {kind} the {role} reconnected by itself and acted on the new leader",
                       f"{(acted - fault_at).total_seconds():.2f}s after the fault" if acted else "")
        after = {r["campaign_id"]: r["seq"] for r in ctx.sql(
            "SELECT campaign_id, max(seq) AS seq FROM ledger.campaign_event GROUP BY 1")}
        lost = [cid for cid, seq in committed.items() if after.get(cid, 0) < seq]
        ctx.expect(not lost, f"nothing committed before the {kind} is missing after it",
                   f"{len(committed)} journals compared; short: {lost[:5]}")
        ctx.expect(all(p.popen.poll() is None for p in procs), f"every process is still up after the {kind}",
                   str({p.name: p.popen.poll() for p in procs}))
        return stall

    @staticmethod
    def _promoted_at(cluster: PatroniCluster, timeline: int) -> datetime | None:
        """When the new leader left recovery: Patroni's history row of the new
        timeline (the time the server wrote its timeline history file)."""
        rows = cluster.history()
        if len(rows) <= timeline:
            return None
        return datetime.fromisoformat(rows[timeline][3])

    @staticmethod
    def _first_after(ctx: DrillContext, when: datetime) -> datetime | None:
        rows: list[dict[str, Any]] = ctx.sql(
            "SELECT min(created_at) AS t FROM ledger.campaign_event WHERE created_at >= %s", when)
        return rows[0]["t"]
