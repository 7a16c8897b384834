"""What the failover and chaos drills share: a whole fleet (workers,
verifiers, a dispatcher with git and HTTP side effects, a sensor), a steady
stream of new objectives, an HTTP target that counts requests per
Idempotency-Key, and the checker that reads the journal, attempts, side
effects, the git reflog and the HTTP counts afterwards."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ledger.db.reads import Reads
from ledger.drills.paths import scripted_attempt
from ledger.errors import LedgerError
from ledger.ops.drill import DrillContext, drill_python

from .workshop import CLASS

NOTIFY = "notify"
SHIP = "ship"
#: Transitions that end a generation's lease: each (campaign, generation) has at most one.
ENDINGS = frozenset({"record_attempt", "fail_attempt", "expire_lease", "abandon"})
#: Where a campaign of class ``work`` may rest once the fleet is idle.
AT_REST = frozenset({"verified", "exhausted", "confirmed", "dismissed", "abandoned"})


class Target:
    """An HTTP service on 127.0.0.1 that applies each Idempotency-Key once and
    counts every request per key (a retry with the same key is legal, a
    second key for one campaign would be a side effect applied twice)."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.applied: dict[str, Any] = {}  # key -> body of the first request
        self._lock = threading.Lock()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key = self.headers.get("Idempotency-Key") or ""
                with target._lock:
                    target.requests[key] += 1
                    if key not in target.applied:
                        target.applied[key] = json.loads(body or b"null")
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/notify"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class Opened:
    """What the drill asked for and was told was done."""

    work: dict[str, int] = field(default_factory=dict)  # objective -> campaign id
    notify: dict[str, int] = field(default_factory=dict)  # idempotency key -> campaign id
    refused: int = 0  # tries that met an outage (then retried)


def ship_classes(targets: int) -> list[str]:
    """The promoted classes: ``ship`` onto main, ``ship-2`` onto target-2 ..."""
    return [SHIP] + [f"{SHIP}-{n}" for n in range(2, targets + 1)]


def branch_of(ship: str) -> str:
    return "main" if ship == SHIP else f"target-{ship.rsplit('-', 1)[1]}"


async def fleet_setup(ctx: DrillContext, *, lease_s: float = 3.0, targets: int = 1) -> Path:
    """Classes ``work`` (random outcomes, each campaign its own file, a passing
    acceptance check), ``ship`` (the same, promoted onto main: git side
    effects; fewer of them, since every promotion moves main under all the
    others, which are rebased and verified again) and ``notify`` (HTTP
    intents, held by the drill), and a sensor observing the repository every
    second. With ``targets`` above 1, ``ship-2`` ... each attempt on and
    promote onto a branch of their own (contended targets: several campaigns
    queue for each). Returns the repository."""
    repo = ctx.repository()
    for ship in ship_classes(targets)[1:]:
        subprocess.run(["git", "-C", str(repo), "branch", branch_of(ship), "main"], check=True,
                       capture_output=True)
    plan = ctx.plan({"default": [["random-own", 0.7]]})
    passing = json.dumps([[drill_python(), "-c", "pass"]])
    body = [f"repository = {json.dumps(str(repo))}",
            f"attempt_command = {json.dumps([drill_python(), str(scripted_attempt()), str(plan)])}",
            "attempt_timeout_s = 60", "max_attempts = 3", f"lease_s = {lease_s}", "heartbeat_s = 0.5",
            "backoff = { base_s = 0, jitter = 0 }", f"acceptance = {{ commands = {passing}, timeout_s = 30 }}",
            'authority.worker = { refs = ["refs/heads/ledger/*"] }']
    ships = [line for ship in ship_classes(targets)
             for line in ("", f"[classes.{ship}]", *body, f'base_ref = "{branch_of(ship)}"',
                          f'promote_to = "refs/heads/{branch_of(ship)}"')]
    text = "\n".join([f"[classes.{CLASS}]", *body, *ships, "", "[sensors.watch]", 'target = "repo"', "every_s = 1.0",
                      f'class = "{CLASS}"', f"command = {json.dumps([drill_python(), '-c', 'pass'])}", ""])
    await ctx.register(ctx.write_config(text))
    operator = await ctx.kernel("operator")
    await operator.register_class(NOTIFY, lease_seconds=3600, authority={"worker": {"hosts": ["127.0.0.1"]}})
    ctx.step(f"classes {CLASS} and {SHIP} (promoted onto main): lease {lease_s:g}s, random outcomes; "
             f"{NOTIFY}: HTTP intents; a sensor every second")
    return repo


async def open_stream(ctx: DrillContext, opened: Opened, target: Target, stop: asyncio.Event, *,
                      every_s: float = 0.5, notify_every: int = 4, ship_every: int = 10,
                      targets: int = 1) -> None:
    """Open an objective every ``every_s`` (and every ``notify_every``-th time
    a ``notify`` campaign with one HTTP intent), retrying each through outages
    until it is acknowledged. The drill's own calls go through the same
    database as the fleet's, so they meet the same faults."""
    n = 0
    while not stop.is_set():
        n += 1
        objective = f"objective-{n}"
        ships = ship_classes(targets)
        cls = ships[(n // ship_every) % len(ships)] if n % ship_every == 0 else CLASS
        while objective not in opened.work:
            try:
                sensor = await ctx.kernel("sensor")
                opened.work[objective] = (await sensor.open_campaign(cls, objective, "repo")).campaign_id
            except LedgerError:
                opened.refused += 1
                await asyncio.sleep(0.2)  # the outage's own pace; the call already retried inside
        if n % notify_every == 0:
            await _notify(ctx, opened, target, f"notify-{n}")
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass


async def _notify(ctx: DrillContext, opened: Opened, target: Target, key: str) -> None:
    """A campaign of class ``notify`` claimed by the drill (as a worker named
    ``drill-notifier``) with one HTTP intent under ``key``."""
    for _ in range(100):
        try:
            sensor, worker = await ctx.kernel("sensor"), await ctx.kernel("worker")
            cid = (await sensor.open_campaign(NOTIFY, key, "hook")).campaign_id
            held = [c for c in await Reads(worker.executor).running_claims("drill-notifier") if c.campaign_id == cid]
            claim = held[0] if held else await worker.claim_campaign("drill-notifier", [NOTIFY])
            if claim is None or claim.campaign_id != cid:
                await asyncio.sleep(0.2)
                continue
            await worker.request_side_effect(cid, claim.generation, kind="http.request", target=target.url,
                                             precondition={}, idempotency_key=key,
                                             payload={"method": "POST", "url": target.url,
                                                      "body": {"campaign": cid, "key": key}})
            opened.notify[key] = cid
            return
        except LedgerError:
            opened.refused += 1
            await asyncio.sleep(0.2)  # through the outage
    ctx.step(f"gave up requesting the HTTP intent {key}")


def at_rest(ctx: DrillContext) -> bool:
    """Every ``work`` campaign rests and no side effect is still to be done."""
    rows = ctx.sql("SELECT (SELECT count(*) FROM ledger.campaign WHERE class <> %s AND state <> ALL(%s)) AS moving, "
                   "(SELECT count(*) FROM ledger.side_effect WHERE state IN ('pending', 'claimed')) AS effects",
                   NOTIFY, list(AT_REST))
    return rows[0]["moving"] == 0 and rows[0]["effects"] == 0


def _motion(ctx: DrillContext) -> int:
    """A number that grows whenever the fleet gets anything done."""
    return int(ctx.sql("SELECT (SELECT count(*) FROM ledger.campaign_event) + (SELECT count(*) FROM "
                       "ledger.side_effect WHERE state NOT IN ('pending', 'claimed')) AS n")[0]["n"])


async def settle(ctx: DrillContext, *, cap_s: float, quiet_s: float = 60.0) -> tuple[bool, str]:
    """Wait for ``at_rest`` as long as the fleet keeps getting things done:
    give up after ``quiet_s`` without any progress (stalled) or ``cap_s`` in
    all (too slow). Returns whether it came to rest, and a line saying how."""
    began = time.monotonic()
    last, moved_at = _motion(ctx), began
    while True:
        if at_rest(ctx):
            return True, f"the fleet came to rest {time.monotonic() - began:.1f}s after the faults stopped"
        now = time.monotonic()
        motion = _motion(ctx)
        if motion != last:
            last, moved_at = motion, now
        if now - moved_at > quiet_s:
            return False, (f"the fleet stalled: nothing happened for {quiet_s:g}s; left: {still_moving(ctx)}")
        if now - began > cap_s:
            return False, (f"the fleet was still working after {cap_s:g}s (last progress "
                           f"{now - moved_at:.0f}s ago); left: {still_moving(ctx)}")
        await asyncio.sleep(1.0)  # the fleet's pace; rows have no notification to wait on here


def still_moving(ctx: DrillContext) -> str:
    """Counts of what has not come to rest (for a verdict that explains itself)."""
    states = ctx.sql("SELECT state, count(*) AS n FROM ledger.campaign WHERE class <> %s GROUP BY 1 "
                     "ORDER BY 1", NOTIFY)
    effects = ctx.sql("SELECT kind, state, count(*) AS n FROM ledger.side_effect GROUP BY 1, 2 ORDER BY 1, 2")
    campaigns = ", ".join(f"{r['state']}={r['n']}" for r in states)
    intents = ", ".join(f"{r['kind']}/{r['state']}={r['n']}" for r in effects)
    return f"work campaigns {campaigns}; side effects {intents}"


def check(ctx: DrillContext, opened: Opened, target: Target, repo: Path) -> dict[str, Any]:
    """Every invariant, as expectations; returns the figures for the timeline."""
    campaigns = {r["id"]: r for r in ctx.sql(
        "SELECT id, objective_key, state, generation, attempt_count, class FROM ledger.campaign")}
    missing = [o for o, cid in opened.work.items() if cid not in campaigns]
    missing += [k for k, cid in opened.notify.items() if cid not in campaigns]
    ctx.expect(not missing and bool(opened.work),
               "0 objectives lost: every acknowledged open has its campaign",
               f"{len(opened.work)} objectives, {len(opened.notify)} HTTP campaigns; missing {missing[:5]}")
    unrested = [(cid, c["state"]) for cid, c in campaigns.items() if c["class"] != NOTIFY and c["state"] not in AT_REST]
    ctx.expect(not unrested, "every campaign came to rest (verified and promoted, or exhausted)",
               f"{len(unrested)} not at rest {unrested[:5]}")

    events = ctx.sql("SELECT campaign_id, seq, generation, payload->>'transition' AS t, payload->>'from' AS f, "
                     "payload->>'to' AS s, (payload->>'attempt_count')::int AS n FROM ledger.campaign_event "
                     "WHERE type = 'transition' ORDER BY campaign_id, seq")
    endings: Counter[tuple[int, int]] = Counter()
    replayed: dict[int, tuple[str, int, int]] = {}
    broken_chain = []
    for e in events:
        if e["t"] in ENDINGS:
            endings[(e["campaign_id"], e["generation"])] += 1
        before = replayed.get(e["campaign_id"])
        if before is not None and e["f"] != before[0]:
            broken_chain.append((e["campaign_id"], e["seq"]))
        replayed[e["campaign_id"]] = (e["s"], e["generation"], e["n"])
    doubled = [k for k, n in endings.items() if n > 1]
    ctx.expect(not doubled, "every (campaign, generation) has at most one ending",
               f"{len(endings)} endings; doubled {doubled[:5]}")
    gaps = ctx.sql("SELECT campaign_id FROM ledger.campaign_event GROUP BY 1 "
                   "HAVING count(*) <> max(seq) OR min(seq) <> 1")
    ctx.expect(not gaps, "journal seqs are gap-free for every campaign", str(gaps[:5]))
    differs = [cid for cid, c in campaigns.items()
               if replayed.get(cid) != (c["state"], c["generation"], c["attempt_count"])]
    ctx.expect(not differs and not broken_chain,
               "state replayed from the journal equals the table (state, generation, attempts)",
               f"{len(differs)} differ {differs[:5]}; {len(broken_chain)} transitions from a state the "
               f"campaign was not in {broken_chain[:5]}")
    open_attempts = ctx.sql("SELECT count(*) AS n FROM ledger.attempt a JOIN ledger.campaign c "
                            "ON c.id = a.campaign_id WHERE a.outcome = 'running' AND c.state <> 'leased'")[0]["n"]
    ctx.expect(open_attempts == 0, "no attempt was left running without its lease")

    effects = ctx.sql("SELECT id, kind, state, campaign_id, idempotency_key, purpose, result "
                      "FROM ledger.side_effect ORDER BY id")
    promotions_done = [e for e in effects if e["kind"] == "git.update_ref" and e["state"] == "done"]
    # A merge batch lands several promotions in one move of the branch: what
    # must hold is one landed commit per promotion done, each campaign's
    # trailer once, on the branches the classes promote to.
    branches = {f"refs/heads/{branch_of(c['class'])}" for c in campaigns.values()
                if c["class"] == SHIP or c["class"].startswith(f"{SHIP}-")} | {"refs/heads/main"}
    landed_commits: list[tuple[str, str]] = []
    for branch in sorted(branches):
        log = subprocess.run(["git", "-C", str(repo), "log", "--format=%H %(trailers:key=Ledger-Campaign,"
                              "valueonly,separator=)", branch], capture_output=True, text=True).stdout
        landed_commits += [(p[0], p[1]) for p in (line.split() for line in log.splitlines()) if len(p) == 2]
    moves = [sha for sha, _ in landed_commits]
    twice = [cid for cid, n in Counter(cid for _, cid in landed_commits).items() if n > 1]
    recorded = sorted(str((e["result"] or {}).get("landed")) for e in promotions_done)
    ctx.expect(sorted(moves) == recorded and not twice,
               "0 git side effects applied twice: one landed commit per promotion done, each campaign's once",
               f"{len(moves)} landed commit(s), {len(promotions_done)} done; campaigns landed twice {twice[:3]}")
    http = [e for e in effects if e["kind"] == "http.request"]
    keys_by_campaign: dict[int, set[str]] = defaultdict(set)
    for key, body in target.applied.items():
        keys_by_campaign[int(body["campaign"])].add(key)
    applied_twice = [cid for cid, keys in keys_by_campaign.items() if len(keys) > 1]
    done_keys = {e["idempotency_key"] for e in http if e["state"] == "done"}
    unapplied = sorted(done_keys - set(target.applied))
    ctx.expect(not applied_twice and not unapplied and len(http) == len(opened.notify),
               "0 HTTP side effects applied twice: one intent and one key per campaign, each done one applied",
               f"{len(http)} intents ({len(done_keys)} done), {sum(target.requests.values())} requests for "
               f"{len(target.applied)} keys; applied twice {applied_twice[:3]}; done but never applied "
               f"{unapplied[:3]}")
    states = Counter(c["state"] for c in campaigns.values() if c["class"] != NOTIFY)
    attempts = ctx.sql("SELECT outcome, count(*) AS n FROM ledger.attempt GROUP BY 1")
    return {"campaigns": dict(states), "attempts": {r["outcome"]: r["n"] for r in attempts},
            "endings": sum(endings.values()), "promotions": len(moves),
            "http_requests": sum(target.requests.values()), "http_keys": len(target.applied),
            "http_retries": sum(target.requests.values()) - len(target.requests)}
