"""merge-queue: N campaigns (60 at full size) verified onto one branch at
once, two of them breaking each other's tests only in combination -> every
good one lands, one commit each with its own trailers; of the pair, the one
queued second is found by bisection and rejected by an ordinary verdict; the
queue verifies far fewer times than N squared, and nothing waits after."""

from __future__ import annotations

import math
import signal
import subprocess
import time

from ledger.ops.drill import Drill, DrillContext, drill_python

from .workshop import WORKER_ARGS, open_campaigns, setup

#: The pair whose changes break each other's tests only together.
PAIR = ("objective-2", "objective-5")


def combined_check() -> list[str]:
    """An acceptance command: the tests of one of the pair fail when the
    other's change is also in the tree."""
    a, b = (f"own/{key}.txt" for key in PAIR)
    code = (f"import pathlib, sys; both = pathlib.Path({a!r}).exists() and pathlib.Path({b!r}).exists(); "
            "print('the pair together' if both else 'fine'); sys.exit(1 if both else 0)")
    return [drill_python(), "-c", code]


class MergeQueue(Drill):
    name = "merge-queue"
    summary = ("N campaigns verified onto one branch at once, one breaking another's tests only in "
               "combination -> all good ones land, the bad one is bisected out and rejected, in far "
               "fewer than N^2 verifications")

    def timeout_s(self, scale: float, minutes: float | None) -> float:
        # the attempts and first verifications of N candidates, then the queue's
        return max(240.0, 120.0 + 8.0 * max(8, round(60 * scale)))

    async def run(self, ctx: DrillContext) -> None:
        n = max(8, round(60 * ctx.scale))
        batch = 8
        _, repo = await setup(ctx, {"default": [["own", "own"], ["exit", 0]]}, lease_s=20, heartbeat_s=2,
                              max_attempts=1, acceptance=[combined_check()], promote=True,
                              sensor=f"[classes.work.merge_queue]\nbatch_size = {batch}\nmax_wait_s = 1\n")
        await open_campaigns(ctx, n)
        workers = [ctx.spawn(f"worker-{i}", *WORKER_ARGS, "--concurrency", "3") for i in (1, 2)]
        verifiers = [ctx.spawn(f"verifier-{i}", "verifier", "--poll", "0.3") for i in (1, 2)]
        deadline = 60 + 3 * n
        verified = await ctx.until(
            lambda: ctx.sql("SELECT count(*) AS n FROM ledger.campaign WHERE state = 'verified'")[0]["n"] == n,
            f"all {n} candidates to be verified on the base", timeout=deadline)
        if not verified:
            raise RuntimeError("the candidates were not all verified, so nothing contends")
        before = ctx.sql("SELECT count(*) AS n FROM ledger.verification WHERE status IN ('accepted', 'rejected')")[0]["n"]
        ctx.step(f"{n} candidates verified onto refs/heads/main's base at once ({before} verifications); "
                 "starting the dispatcher")
        started = time.monotonic()
        dispatcher = ctx.spawn("dispatcher", "dispatcher", "--poll", "0.3")

        def settled() -> bool:
            rows = ctx.sql("SELECT count(*) FILTER (WHERE state = 'verified' AND promoted_at IS NOT NULL) AS landed, "
                           "count(*) FILTER (WHERE state IN ('ready', 'exhausted', 'leased', 'attempted')) AS out "
                           "FROM ledger.campaign")[0]
            return bool(rows["landed"] == n - 1 and rows["out"] == 1
                        and ctx.sql("SELECT count(*) AS n FROM ledger.merge_queue")[0]["n"] == 0)

        done = await ctx.until(settled, "every good candidate to land and the bad one to leave",
                               timeout=deadline + 10 * n)
        took = time.monotonic() - started
        ctx.expect(done, f"{n - 1} good candidates landed and the queue is empty")

        states = {r["objective_key"]: r for r in ctx.sql(
            "SELECT id, objective_key, state, promoted_sha, attempt_count, last_failure_reason "
            "FROM ledger.campaign ORDER BY id")}
        # queue order: the order of the first promotion intents
        positions = {r["campaign_id"]: r["first"] for r in ctx.sql(
            "SELECT campaign_id, min(id) AS first FROM ledger.side_effect "
            "WHERE purpose = 'promotion' GROUP BY campaign_id")}
        first, second = sorted(PAIR, key=lambda k: positions.get(states[k]["id"], 0))
        bad = [k for k, r in states.items() if r["promoted_sha"] is None]
        ctx.expect(bad == [second], "exactly one campaign did not land: of the pair, the one queued second",
                   f"{bad}; the pair in queue order: {first}, {second}")
        if bad:
            row = states[bad[0]]
            ctx.expect(row["state"] == "exhausted" and "rejected" in (row["last_failure_reason"] or ""),
                       "it was rejected by an ordinary verdict (its one attempt spent)",
                       f"{row['state']}: {row['last_failure_reason']}")
        ctx.expect(states[first]["promoted_sha"] is not None or states[second]["promoted_sha"] is not None,
                   "its partner landed")
        log = subprocess.run(["git", "-C", str(repo), "log", "--format=%H %(trailers:key=Ledger-Campaign,valueonly,separator=)",
                              "refs/heads/main"], capture_output=True, text=True).stdout.split("\n")
        trailers = [line.split()[1] for line in log if len(line.split()) == 2]
        landed = sorted(str(r["id"]) for r in states.values() if r["promoted_sha"] is not None)
        ctx.expect(sorted(trailers) == landed,
                   "one commit per landed campaign on main, each with its own Ledger-Campaign trailer",
                   f"{len(trailers)} commits for {len(landed)} landings")
        ctx.expect(all(r["attempt_count"] == 1 for r in states.values()),
                   "the queue charged nobody: every campaign spent its one attempt")
        once = ctx.sql("SELECT campaign_id, count(*) AS n FROM ledger.side_effect WHERE purpose = 'promotion' "
                       "AND state = 'done' GROUP BY campaign_id HAVING count(*) <> 1")
        ctx.expect(not once, "exactly one promotion recorded done per landed campaign", str(once))
        waiting = ctx.sql("SELECT count(*) AS n FROM ledger.side_effect WHERE state IN ('pending', 'claimed')")[0]["n"]
        open_batches = ctx.sql("SELECT count(*) AS n FROM ledger.merge_batch WHERE closed_at IS NULL")[0]["n"]
        ctx.expect(waiting == 0 and open_batches == 0, "nothing waits: no intent pending, no batch open",
                   f"{waiting} intent(s), {open_batches} batch(es)")

        total = ctx.sql("SELECT count(*) AS n FROM ledger.verification WHERE status IN ('accepted', 'rejected')")[0]["n"]
        queue_verifications = total - before
        batches = ctx.sql("SELECT state, count(*) AS n, max(cardinality(members)) AS largest "
                          "FROM ledger.merge_batch GROUP BY state ORDER BY state")
        landings = len(landed)
        per = total / landings if landings else math.inf
        ctx.step(f"measured: {queue_verifications} verifications by the queue for {landings} landings of {n} "
                 f"({total} in all, {per:.2f} per landed candidate; re-verifying every pending candidate "
                 f"after every landing would take about {n * (n - 1) // 2}); batches "
                 + ", ".join(f"{b['state']} {b['n']}" for b in batches)
                 + f"; settled {took:.1f}s after the dispatcher started")
        ctx.expect(queue_verifications <= n // batch + 2 * math.ceil(math.log2(batch)) + 4,
                   "the queue verified about once per batch, plus a bisection",
                   f"{queue_verifications} verification(s) for {n} candidates in batches of {batch}")
        ctx.expect(queue_verifications < n, "fewer verifications by the queue than candidates (not N^2)")

        for p in (*workers, *verifiers, dispatcher):
            p.signal(signal.SIGTERM)
        ctx.expect(all(p.wait(30) == 0 for p in (*workers, *verifiers, dispatcher)), "every process stops cleanly")
