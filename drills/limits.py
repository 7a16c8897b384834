"""limits: worker processes on data dirs of their own claim against three
caps (class, repository, a heavy tenant), one rate bucket and a budget per
campaign while campaigns of a heavy and a light tenant are opened
continuously; every attempt reports its usage (LEDGER_USAGE) and fails, so
each campaign spends its budget and ends budget_exhausted -> from the
journal (not the counters): no cap was ever exceeded, the bucket's
overshoot is at most 1 %, no budget-exhausted campaign was started again
until an operator raised its budget (and one that was raised was), and the
light tenant's campaigns were each claimed without waiting behind the
heavy tenant's backlog. Prints each figure.

The journal's instants are those of each write's statement: a claim that
queued on a key's counter row behind the ending that freed its slot starts
(and is stamped) a moment before that ending. Such an overlap lasts less
than a statement; a real excess would last an attempt (seconds here), so an
excess is counted only if it lasts longer than ``ARTIFACT_S``.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from ledger.ops.drill import Drill, DrillContext, Proc, UnderExercised, drill_python

CLASS = "work"
CAPS = {"class:work": 5, "repo:repo": 3, "tenant:heavy": 2}
RPM = 150.0
COST, MAX_COST, RAISED = 0.1, 0.25, 0.45
ARTIFACT_S = 0.05

AGENT = r'''
import json, sys, time
json.load(sys.stdin)
spec = json.load(open(sys.argv[1]))
print("LEDGER_USAGE " + json.dumps({"tokens_in": 1200, "tokens_out": 300, "requests": 1,
                                    "cost": spec["cost"]}), flush=True)
time.sleep(spec["work_s"])
print("no fix found", flush=True)
sys.exit(1)
'''


class Limits(Drill):
    name = "limits"
    summary = ("workers on separate data dirs against 3 caps, a rate bucket and budgets, campaigns opened "
               "continuously -> per the journal no cap exceeded, bucket overshoot <= 1 %, a budget-"
               "exhausted campaign never started again until raised, the light tenant not starved")

    def timeout_s(self, scale: float, minutes: float | None) -> float:
        return 60.0 + 150.0 * max(scale, 0.1)

    async def run(self, ctx: DrillContext) -> None:
        run_s = max(20.0, 120.0 * ctx.scale)
        work_s = 2.0 if ctx.scale < 0.5 else 3.0
        markers = ctx.markers
        agent = markers / "agent.py"
        agent.write_text(AGENT)
        spec = markers / "spec.json"
        spec.write_text(json.dumps({"cost": COST, "work_s": work_s}))
        repo = ctx.repository()
        config = ctx.write_config("\n".join([
            "[limits.model-a]", f"requests_per_minute = {RPM}", "tokens_per_minute = 10000000", "",
            '[keys."repo:repo"]', f"max_leased = {CAPS['repo:repo']}", "",
            '[keys."tenant:heavy"]', f"max_leased = {CAPS['tenant:heavy']}", "",
            f"[classes.{CLASS}]",
            f"repository = {json.dumps(str(repo))}",
            f"attempt_command = {json.dumps([drill_python(), str(agent), str(spec)])}",
            "attempt_timeout_s = 60", "max_attempts = 20", "lease_s = 5", "heartbeat_s = 1",
            "backoff = { base_s = 0, jitter = 0 }", "reobserve_before_start = false",
            f"cell = {{ writable = {json.dumps([str(markers)])} }}",
            'limit_keys = ["class", "repo", "tenant"]', 'uses = ["model-a"]', 'fair_key = "tenant"',
            f"max_cost = {MAX_COST}", f"max_leased = {CAPS['class:work']}", ""]))
        await ctx.register(config)
        ctx.step(f"caps {CAPS}; bucket model-a {RPM:g} requests/min; max_cost {MAX_COST} per campaign, "
                 f"{COST} reported per attempt of {work_s:g}s (every attempt fails)")

        workers: list[Proc] = []
        for i in range(3):
            data = ctx.workspace / f"data-{i}"
            data.mkdir()
            workers.append(ctx.spawn(f"worker-{i}", "worker", "--concurrency", "3", "--poll", "0.2",
                                     "--grace", "0.5", LEDGER_DATA_DIR=str(data)))
        sensor = await ctx.kernel("sensor")
        operator = await ctx.kernel("operator")
        opened: dict[int, str] = {}
        waiting_seen: set[str] = set()
        loop = asyncio.get_running_loop()
        end = loop.time() + run_s
        n = 0
        raised: int | None = None
        exhausted_at_raise = 0
        while loop.time() < end:
            n += 1
            # the light tenant starts a third of the way in, behind the heavy tenant's backlog
            late = loop.time() > end - run_s * 2 / 3
            tenant = "light" if n % 6 == 0 and late else "mid" if n % 6 == 3 else "heavy"
            target = "repo-b" if n % 2 == 0 else "repo"  # two repositories: the class's cap binds too
            got = await sensor.open_campaign(CLASS, f"limits-{tenant}-{n}", target, labels=[f"tenant:{tenant}"])
            opened[got.campaign_id] = tenant
            for row in ctx.sql("SELECT DISTINCT split_part(waiting_for, ' ', 1) || ' ' || "
                               "split_part(waiting_for, ' ', 2) AS w FROM ledger_api.campaigns "
                               "WHERE waiting_for IS NOT NULL"):
                waiting_seen.add(row["w"])
            if raised is None and loop.time() > end - run_s / 2:
                done = ctx.sql("SELECT id FROM ledger.campaign WHERE state = 'budget_exhausted' ORDER BY id LIMIT 1")
                if done:
                    raised = done[0]["id"]
                    exhausted_at_raise = len(ctx.sql("SELECT 1 FROM ledger.campaign_event WHERE campaign_id = %s",
                                                     raised))
                    await operator.raise_budget(raised, RAISED, operator="drill-operator",
                                                reason="one more try")
                    ctx.step(f"raised the budget of campaign {raised} to {RAISED}")
            await asyncio.sleep(random.uniform(0.1, 0.3))  # the intake's own cadence
        ctx.step(f"opened {len(opened)} campaigns over {run_s:g}s "
                 f"({sum(t == 'light' for t in opened.values())} of the light tenant)")
        if raised is not None:
            await ctx.until(lambda: ctx.state(raised) == "budget_exhausted" and len(ctx.sql(
                "SELECT 1 FROM ledger.campaign_event WHERE campaign_id = %s", raised)) > exhausted_at_raise,
                "the raised campaign to be attempted again", timeout=60)
        for w in workers:
            w.signal(signal.SIGTERM)
        codes = [w.wait(60) for w in workers]
        ctx.expect(codes == [0, 0, 0], "the workers drain and exit 0", str(codes))

        events = ctx.sql(
            "SELECT e.campaign_id, e.seq, e.created_at, e.payload ->> 'transition' AS t, "
            "e.payload ->> 'from' AS f, e.payload ->> 'to' AS s, c.limit_keys "
            "FROM ledger.campaign_event e JOIN ledger.campaign c ON c.id = e.campaign_id "
            "WHERE e.type = 'transition' ORDER BY e.campaign_id, e.seq")
        self.check_caps(ctx, events)
        self.check_bucket(ctx, events)
        self.check_budgets(ctx, events, raised)
        self.check_tenants(ctx, events, opened)
        ctx.step("waiting_for seen while it ran: " + (", ".join(sorted(waiting_seen)) or "none"))
        ctx.expect(any(w.startswith("limit ") for w in waiting_seen),
                   "a capped campaign was seen waiting, saying so (waiting_for: limit KEY n/cap)")

    @staticmethod
    def leases(events: list[dict[str, Any]]) -> list[tuple[datetime, datetime | None, list[str]]]:
        """Each lease from the journal: (claimed, ended or None, the campaign's keys)."""
        out: list[tuple[datetime, datetime | None, list[str]]] = []
        start: dict[int, datetime] = {}
        for e in events:
            if e["f"] == "leased" and e["campaign_id"] in start:
                out.append((start.pop(e["campaign_id"]), e["created_at"], e["limit_keys"]))
            if e["s"] == "leased":
                start[e["campaign_id"]] = e["created_at"]
        keys = {e["campaign_id"]: e["limit_keys"] for e in events}
        out.extend((t, None, keys[cid]) for cid, t in start.items())
        return out

    def check_caps(self, ctx: DrillContext, events: list[dict[str, Any]]) -> None:
        leases = self.leases(events)
        for key, cap in CAPS.items():
            points: list[tuple[datetime, int]] = []
            for start, stop, keys in leases:
                if key in keys:
                    points.append((start, 1))
                    if stop is not None:
                        points.append((stop, -1))
            points.sort(key=lambda p: (p[0], p[1]))  # an ending at the same instant first
            held = peak = 0
            over_since: datetime | None = None
            excess: list[float] = []
            for at, delta in points:
                held += delta
                peak = max(peak, held)
                if held > cap and over_since is None:
                    over_since = at
                elif held <= cap and over_since is not None:
                    excess.append((at - over_since).total_seconds())
                    over_since = None
            real = [x for x in excess if x > ARTIFACT_S]
            ctx.step(f"cap {key} = {cap}: {len(points) // 2} leases under it, journal peak {peak} "
                     f"({len(excess)} overlap(s) shorter than a statement: "
                     f"{max(excess, default=0) * 1000:.1f} ms at most)")
            ctx.expect(not real and over_since is None, f"no more than {cap} leased at once under {key} "
                       "(from the journal)", f"{len(real)} excess interval(s), longest {max(real, default=0):.3f}s")
            if peak < cap:
                raise UnderExercised(f"the cap of {key} was never reached (peak {peak}): run longer")

    def check_bucket(self, ctx: DrillContext, events: list[dict[str, Any]]) -> None:
        claims = sorted(e["created_at"] for e in events if e["t"] == "claim")
        span = (claims[-1] - claims[0]).total_seconds() if len(claims) > 1 else 0.0
        allowed = 1 + RPM / 60.0 * span
        overshoot = max(0.0, (len(claims) - allowed) / allowed * 100)
        window = 10.0
        worst = 0.0
        j = 0
        for i, t in enumerate(claims):  # every window of 10 s starting at a claim
            while j < len(claims) and (claims[j] - t).total_seconds() < window:
                j += 1
            worst = max(worst, (j - i) / (1 + RPM / 60.0 * window))
        ctx.step(f"bucket model-a: {len(claims)} claims in {span:.1f}s, {allowed:.1f} allowed "
                 f"({len(claims) / span * 60 if span else 0:.1f}/min of {RPM:g}); overshoot "
                 f"{overshoot:.2f} %; busiest 10 s window at {worst * 100:.1f} % of its allowance")
        ctx.expect(overshoot <= 1.0, "the bucket's overshoot over the run is at most 1 %", f"{overshoot:.2f} %")

    def check_budgets(self, ctx: DrillContext, events: list[dict[str, Any]], raised: int | None) -> None:
        by_campaign: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for e in events:
            by_campaign[e["campaign_id"]].append(e)
        exhausted = restarted = 0
        raised_again = False
        for cid, evs in by_campaign.items():
            blocked = False
            for e in evs:
                if e["t"] == "exhaust_budget":
                    exhausted += 1
                    blocked = True
                elif e["t"] == "raise_budget":
                    blocked = False
                elif e["t"] == "claim":
                    if blocked:
                        restarted += 1
                    elif cid == raised and any(x["t"] == "raise_budget" for x in evs[:evs.index(e)]):
                        raised_again = True
        spent = ctx.sql("SELECT max(cost_spent) AS top, count(*) FILTER (WHERE state = 'budget_exhausted') AS n "
                        "FROM ledger.campaign")[0]
        ctx.step(f"budgets: {exhausted} budget exhaustion(s), {spent['n']} campaign(s) budget_exhausted now, "
                 f"most spent {spent['top']} (max_cost {MAX_COST}); {restarted} start(s) while exhausted")
        ctx.expect(restarted == 0, "no budget-exhausted campaign was started again before its budget was raised")
        if exhausted == 0:
            raise UnderExercised("no campaign spent its budget: run longer")
        ctx.expect(raised is not None and raised_again, "the campaign whose budget was raised was attempted again",
                   f"campaign {raised}")

    def check_tenants(self, ctx: DrillContext, events: list[dict[str, Any]], opened: dict[int, str]) -> None:
        first: dict[int, float] = {}
        opened_at: dict[int, datetime] = {}
        for e in events:
            if e["t"] == "open":
                opened_at[e["campaign_id"]] = e["created_at"]
            elif e["t"] == "claim" and e["campaign_id"] not in first and e["campaign_id"] in opened_at:
                first[e["campaign_id"]] = (e["created_at"] - opened_at[e["campaign_id"]]).total_seconds()
        waits: dict[str, list[float]] = {"heavy": [], "mid": [], "light": []}
        unclaimed = {"heavy": 0, "mid": 0, "light": 0}
        for cid, tenant in opened.items():
            if cid in first:
                waits[tenant].append(first[cid])
            else:
                unclaimed[tenant] += 1

        def p50(xs: list[float]) -> float:
            return sorted(xs)[len(xs) // 2] if xs else 0.0
        ctx.step(f"first claim after open: light tenant p50 {p50(waits['light']):.2f}s, max "
                 f"{max(waits['light'], default=0):.2f}s ({unclaimed['light']} never claimed); heavy tenant p50 "
                 f"{p50(waits['heavy']):.2f}s, max {max(waits['heavy'], default=0):.2f}s "
                 f"({unclaimed['heavy']} never claimed)")
        # The light tenant's first campaign, opened behind the heavy tenant's backlog: how many
        # claims went to others between its open and its own first claim (fair: the next claim).
        claims = sorted((e["created_at"], e["campaign_id"]) for e in events if e["t"] == "claim")
        light = sorted(cid for cid, t in opened.items() if t == "light")
        if not light or light[0] not in first:
            ctx.expect(False, "the light tenant's first campaign was claimed")
            return
        cid = light[0]
        before = sum(1 for at, c in claims if opened_at[cid] <= at and c != cid
                     and at < opened_at[cid] + timedelta(seconds=first[cid]))
        backlog = sum(1 for c, t in opened.items() if t == "heavy" and c < cid)
        share = {t: sum(1 for _, c in claims if opened.get(c) == t) for t in ("heavy", "mid", "light")}
        ctx.step(f"the light tenant's first campaign ({cid}, opened behind {backlog} of the heavy tenant's) "
                 f"was claimed {first[cid]:.2f}s after its open, after {before} other claim(s); claims by "
                 f"tenant: {share}")
        ctx.expect(before <= 1, "the heavy tenant's backlog delays the light tenant's first campaign by at most "
                   "one claim round", f"{before} claims went first")
