"""upgrade: a fleet of the previous release works under load (its worker,
verifier, dispatcher and a sensor opening and confirming campaigns); this
release runs `ledger migrate` under it; this release's roles start and the
old ones stop -> every campaign opened is confirmed once, nothing lost or
doubled, nothing stuck, the old roles kept working on the new schema, and
the pause the migration caused is measured and printed (docs/upgrading.md)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ledger.ops import releases
from ledger.ops.drill import Drill, DrillContext, Proc, UnderExercised, drill_python
from ledger.release import RELEASE, RELEASES

from .paths import scripted_attempt

CLASS = "work"
LOAD = Path(__file__).with_name("upgrade_load.py")


def config(repo: Path, plan: Path) -> str:
    """ledger.toml, in the form the previous release and this one both read."""
    def q(value: Any) -> str:
        return json.dumps(value)
    return "\n".join([
        f"[classes.{CLASS}]",
        f"repository = {q(str(repo))}",
        f"attempt_command = {q([drill_python(), str(scripted_attempt()), str(plan)])}",
        "attempt_timeout_s = 60", "max_attempts = 3", "lease_s = 20", "heartbeat_s = 2",
        "backoff = { base_s = 0, jitter = 0 }",
        'promote_to = "refs/heads/main"',
        'authority.worker = { refs = ["refs/heads/ledger/*"] }',
        f"acceptance = {{ commands = {q([[drill_python(), '-c', 'pass']])}, timeout_s = 30, "
        f"cell = {{ writable = {q([str(plan.parent)])} }} }}",
        f"cell = {{ writable = {q([str(plan.parent)])} }}",
        f"[classes.{CLASS}.merge_queue]", "batch_size = 4", "max_wait_s = 1", ""])


class Upgrade(Drill):
    name = "upgrade"
    summary = ("the previous release's roles work under load; this release migrates under them, its roles "
               "start, the old ones stop -> nothing lost or doubled, nothing stuck; the pause measured")
    migrated = False  # the previous release makes its database

    def timeout_s(self, scale: float, minutes: float | None) -> float:
        return 240.0 + 8.0 * max(12, round(120 * scale))

    async def run(self, ctx: DrillContext) -> None:
        previous = RELEASES[-1]
        try:
            old = releases.ledger_command(previous.version)
            old_python = releases.python(previous.version)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            raise UnderExercised(f"release {previous.version} cannot be installed here: {exc}") from None
        n = max(12, round(120 * ctx.scale))
        # the opening spans the whole drill: the old fleet, the migration, the switch
        rate = n / max(25.0, n / 4)
        repo = ctx.repository()
        plan = ctx.plan({"default": [["own", "own"], ["exit", 0]]})
        ctx.config_path.write_text(config(repo, plan))
        env = ctx.env()

        def old_cli(*args: str) -> None:
            proc = subprocess.run([*old, *args], env=env, capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"ledger {previous.version} {' '.join(args)}: {proc.stderr.strip()}")

        old_cli("migrate")
        old_cli("classes", "sync")
        ctx.step(f"Ledger {previous.version} made the database (schema {previous.schema}) and its class")

        def spawn_old(name: str, cmd: list[str], out: Path | None = None) -> subprocess.Popen[bytes]:
            log = ctx.workspace / f"{name}.log"
            popen = subprocess.Popen(cmd, env=env, stdout=(out or log).open("ab"),
                                     stderr=log.open("ab") if out else subprocess.STDOUT)
            ctx.procs.append(Proc(name, popen, log))  # stopped with the drill's own, whatever happens
            ctx.step(f"started {name} of Ledger {previous.version} (pid {popen.pid})")
            return popen

        stop_file = ctx.workspace / "stop-load"
        load_log = ctx.workspace / "old-load.out"
        load = spawn_old("old-sensor", [old_python, str(LOAD), ctx.db.url, ctx.db.role_prefix, CLASS, str(n),
                                        str(rate), str(stop_file)], out=load_log)
        ctx.step(f"the previous release's sensor opens {n} campaigns at {rate:g}/s and confirms each promoted one")
        old_roles = [spawn_old("old-worker", [*old, "worker", "--concurrency", "3", "--poll", "0.3"]),
                     spawn_old("old-verifier", [*old, "verifier", "--poll", "0.3"]),
                     spawn_old("old-verifier-2", [*old, "verifier", "--poll", "0.3"]),
                     spawn_old("old-dispatcher", [*old, "dispatcher", "--poll", "0.3"])]

        def confirmed() -> int:
            return int(ctx.sql("SELECT count(*) AS n FROM ledger.campaign WHERE state = 'confirmed'")[0]["n"])

        if not await ctx.until(lambda: confirmed() >= max(3, n // 4), "the old fleet to confirm a quarter",
                               timeout=60 + 2.0 * n):
            raise RuntimeError("the previous release's fleet did not get going")
        ctx.step(f"the old fleet works: {confirmed()} confirmed so far")

        # --- this release migrates the database under the old fleet ---
        before = ctx.sql("SELECT now() AS t")[0]["t"]
        started = time.monotonic()
        proc = subprocess.run(releases.current_ledger() + ["migrate"], env=env, capture_output=True,
                              text=True, timeout=300)
        took = time.monotonic() - started
        after = ctx.sql("SELECT now() AS t")[0]["t"]
        ctx.expect(proc.returncode == 0, f"Ledger {RELEASE} migrates the database while the old fleet runs",
                   proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "")
        if proc.returncode != 0:
            return
        gaps = ctx.sql(
            "SELECT max(gap) AS longest FROM (SELECT created_at - lag(created_at) OVER (ORDER BY created_at) AS gap "
            "FROM ledger.campaign_event WHERE created_at BETWEEN %s AND %s) g",
            before - timedelta(seconds=5), after + timedelta(seconds=5))[0]["longest"]
        typical = ctx.sql(
            "SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM gap)) AS p99 FROM ("
            "SELECT created_at - lag(created_at) OVER (ORDER BY created_at) AS gap "
            "FROM ledger.campaign_event WHERE created_at < %s) g", before)[0]["p99"]
        pause = gaps.total_seconds() if gaps else 0.0
        ctx.step(f"measured: `ledger migrate` took {took:.2f}s under load; the longest pause between journal "
                 f"events around it {pause:.2f}s (p99 gap before it {float(typical or 0):.2f}s)")
        at_migration = confirmed()
        still = await ctx.until(lambda: confirmed() >= at_migration + 2 and all(p.poll() is None for p in old_roles),
                                "the old fleet to go on working on the new schema", timeout=90)
        ctx.expect(still, f"Ledger {previous.version}'s roles keep working on the migrated schema",
                   f"{confirmed() - at_migration} more confirmed by them")

        # --- this release's roles start, the old ones stop ---
        new_roles = [ctx.spawn("worker", "worker", "--concurrency", "3", "--poll", "0.3"),
                     ctx.spawn("verifier", "verifier", "--poll", "0.3"),
                     ctx.spawn("dispatcher", "dispatcher", "--poll", "0.3")]
        await ctx.until(lambda: ctx.sql("SELECT count(*) AS n FROM ledger.process WHERE pid = %s "
                                        "AND stopped_at IS NULL", new_roles[0].pid)[0]["n"] > 0,
                        "this release's worker to register", timeout=60)
        for p in old_roles:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(60) for p in old_roles]
        ctx.expect(codes == [0] * len(old_roles), "the old roles stop cleanly", str(codes))
        stop_file.write_text("stop")
        load.wait(120)
        ctx.step(f"old roles stopped; this release's roles and sensor go on ({confirmed()} confirmed)")

        # this release's sensor role confirms what is left (the drill's own kernel)
        sensor = await ctx.kernel("sensor")

        async def settle() -> bool:
            for row in ctx.sql("SELECT id, objective_key FROM ledger.campaign WHERE state = 'verified' "
                               "AND promoted_at IS NOT NULL AND promoted_at < now() - interval '50 milliseconds'"):
                now = datetime.now(timezone.utc)
                await sensor.record_observation("upgrade-drill", row["objective_key"], "repo", "green",
                                                now - timedelta(milliseconds=10), finished_at=now,
                                                details={"exit_code": 0}, class_=CLASS)
            return confirmed() == n

        done = await ctx.until(settle, f"all {n} campaigns confirmed", timeout=60 + 4 * n, interval=0.3)
        for p in new_roles:
            p.signal(signal.SIGTERM)
        ctx.expect(all(p.wait(30) == 0 for p in new_roles), "this release's roles stop cleanly")

        opened = [json.loads(line)["opened"] for line in load_log.read_text().splitlines() if "opened" in line]
        rows = ctx.sql("SELECT id, state, attempt_count FROM ledger.campaign ORDER BY id")
        ctx.expect(len(opened) == n and sorted(opened) == [r["id"] for r in rows],
                   f"every one of the {n} campaigns opened is there (nothing lost)",
                   f"{len(opened)} opened, {len(rows)} in the database")
        ctx.expect(done and all(r["state"] == "confirmed" for r in rows), "every campaign is confirmed (nothing stuck)",
                   ", ".join(f"{r['id']}:{r['state']}" for r in rows if r["state"] != "confirmed"))
        doubled = ctx.sql("SELECT campaign_id, generation, count(*) AS n FROM ledger.campaign_event "
                          "WHERE type = 'attempt.started' GROUP BY 1, 2 HAVING count(*) > 1")
        ctx.expect(not doubled, "no lease ran its attempt twice", str(doubled))
        once = ctx.sql("SELECT campaign_id, count(*) AS n FROM ledger.side_effect WHERE purpose = 'promotion' "
                       "AND state = 'done' GROUP BY campaign_id HAVING count(*) <> 1")
        ctx.expect(not once, "each campaign promoted exactly once (nothing doubled)", str(once))
        landed = subprocess.run(["git", "-C", str(repo), "log", "--format=%(trailers:key=Ledger-Campaign,valueonly,separator=)",
                                 "refs/heads/main"], capture_output=True, text=True).stdout.split()
        ctx.expect(sorted(landed, key=int) == [str(r["id"]) for r in rows],
                   "one commit per campaign on main", f"{len(landed)} commits for {len(rows)} campaigns")
        ctx.expect(all(r["attempt_count"] == 1 for r in rows),
                   "the upgrade charged nobody: every campaign spent exactly its one attempt",
                   str([r for r in rows if r["attempt_count"] != 1]))
        gaps_left = ctx.sql("SELECT c.id FROM ledger.campaign c JOIN ledger.campaign_event e ON e.campaign_id = c.id "
                            "GROUP BY c.id HAVING count(*) <> c.event_seq OR max(e.seq) <> c.event_seq")
        ctx.expect(not gaps_left, "every journal is gap-free", str(gaps_left))
        by_new = ctx.sql("SELECT count(*) FILTER (WHERE worker LIKE %s) AS new, count(*) AS all FROM ledger.attempt",
                         f"%:{new_roles[0].pid}:%")[0]
        ctx.expect(by_new["new"] > 0 and by_new["new"] < by_new["all"],
                   "both releases' workers made attempts", f"{by_new['new']} of {by_new['all']} by this release's")
        ctx.step(f"measured: migration {took:.2f}s, longest pause {pause:.2f}s, {n} campaigns across the upgrade")
