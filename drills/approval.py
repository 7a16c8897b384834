"""approval: campaigns under every approval policy (always, when, never, and
a timeout that denies, abandons or approves), their notices sent to a chat
hook, decisions by `ledger approve`/`ledger deny` and over HTTP, a database
restart and a dispatcher SIGKILL while they wait -> every decision applied
exactly once, nothing promoted without one, no worker or cell held while
waiting; decision-to-promotion p50/p99 measured (the dispatcher is woken:
it polls only every 30 s). Runs on a throwaway cluster of its own (it
restarts the server)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from ledger.api import hash_token, new_token
from ledger.drills.paths import scripted_attempt
from ledger.ops.drill import Drill, DrillContext, UnderExercised, drill_python

from .workshop import _toml

#: Seconds an approval of the timeout classes waits before its class decides:
#: longer than the faults take, so the deadlines are met after them.
TIMEOUT_S = 25.0
#: What the dispatchers wait between polls: a promotion within a second of its
#: decision is the wake-up's doing, never a poll's.
DISPATCHER_POLL_S = 30.0


class Hook:
    """A chat webhook on loopback: what it was sent, with each Idempotency-Key."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hook.received.append((self.headers.get("Idempotency-Key") or "", json.loads(body or b"{}")))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _descendants(pid: int) -> list[tuple[int, str]]:
    """Every living process below ``pid``, with its command name."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
        names[int(entry)] = name
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append((p, names.get(p, "?")))
        todo.extend(children.get(p, []))
    return found


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Approval(Drill):
    name = "approval"
    summary = ("campaigns under each approval policy; decisions by CLI, HTTP and timeout; a database "
               "restart and a dispatcher SIGKILL while they wait -> each decision applied once, nothing "
               "promoted without one, nothing held while waiting; decision-to-promotion p50/p99")
    own_cluster = True

    def timeout_s(self, scale: float, minutes: float | None) -> float:
        return 150.0 + 12.0 * self._gates(scale)

    @staticmethod
    def _gates(scale: float) -> int:
        return max(4, round(20 * scale))

    async def run(self, ctx: DrillContext) -> None:
        hook = Hook()
        try:
            await self._run(ctx, hook)
        finally:
            hook.close()

    def _classes(self, ctx: DrillContext, repo: Path, hook: Hook, n: int) -> dict[str, dict[str, Any]]:
        """Each class's table: one promotion branch of its own (a landing never
        moves another campaign's target), and its approval policy."""
        always = {"approval": "always", "approval_notify": hook.url}
        classes: dict[str, dict[str, Any]] = {f"gate-{i}": dict(always) for i in range(1, n + 1)}
        for then in ("deny", "abandon", "approve"):
            classes[f"timeout-{then}"] = {"approval": "always", "approval_timeout_s": TIMEOUT_S,
                                          "approval_on_timeout": then, "approval_notify": hook.url}
        classes["when"] = {"approval": {"when": [{"paths": ["own/when-a*"]}]}}
        classes["never"] = {}
        for name in classes:
            subprocess.run(["git", "-C", str(repo), "branch", name, "main"], check=True)
        return classes

    def _config(self, ctx: DrillContext, repo: Path, plan: Path, classes: dict[str, dict[str, Any]]) -> str:
        accept = [[drill_python(), "-c", "print('the change is there')"]]
        out = []
        for name, policy in classes.items():
            out += [f"[classes.{name}]",
                    f"repository = {_toml(str(repo))}",
                    f"attempt_command = {_toml([drill_python(), str(scripted_attempt()), str(plan)])}",
                    "attempt_timeout_s = 60", "max_attempts = 1", "lease_s = 10", "heartbeat_s = 1",
                    "backoff = { base_s = 0, jitter = 0 }",
                    f"acceptance = {{ commands = {_toml(accept)}, timeout_s = 30 }}",
                    'authority.worker = { refs = ["refs/heads/ledger/*"] }',
                    f"cell = {{ writable = {_toml([str(plan.parent)])} }}",
                    f'promote_to = "refs/heads/{name}"']
            for key, value in policy.items():
                if isinstance(value, dict):
                    conditions = ", ".join("{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in c.items()) + " }"
                                           for c in value["when"])
                    out.append(f"approval = {{ when = [{conditions}] }}")
                else:
                    out.append(f"{key} = {_toml(value)}")
            out.append("")
        return "\n".join(out)

    async def _run(self, ctx: DrillContext, hook: Hook) -> None:
        n = self._gates(ctx.scale)
        repo = ctx.repository()
        plan = ctx.plan({"default": [["own", "own"], ["exit", 0]]})
        classes = self._classes(ctx, repo, hook, n)
        config = ctx.write_config(self._config(ctx, repo, plan, classes))
        await ctx.register(config)
        ctx.step(f"{len(classes)} classes, each promoting onto a branch of its own: {n} gated (always, "
                 f"a notice to the hook), 3 whose {TIMEOUT_S:g} s timeout denies, abandons or approves, "
                 "one asking only when a path matches, one never asking")
        sensor = await ctx.kernel("sensor")
        ids: dict[str, int] = {}
        timed = [name for name in classes if name.startswith("timeout-")]
        for name in classes:  # the timeout classes' later: their deadlines must come after the faults
            for key in (["when-a", "when-b"] if name == "when" else [] if name in timed else [name]):
                ids[key] = (await sensor.open_campaign(name, key, "repo")).campaign_id
        asking = [k for k in ids if k not in ("when-b", "never")] + timed

        token = new_token()
        port = _free_port()
        procs = [ctx.spawn(f"worker-{i}", "worker", "--poll", "0.3", "--grace", "0.5", "--concurrency", "1")
                 for i in (1, 2)]
        procs.append(ctx.spawn("verifier", "verifier", "--poll", "0.3"))
        dispatcher = ctx.spawn("dispatcher-1", "dispatcher", "--poll", str(DISPATCHER_POLL_S))
        serve = ctx.spawn("serve", "serve", "--host", "127.0.0.1", "--port", str(port),
                          LEDGER_API_TOKENS=f"drill-operator:operator:{hash_token(token)}")
        procs.append(serve)

        def states() -> dict[str, str]:
            by_id = {r["id"]: r["state"] for r in ctx.sql("SELECT id, state FROM ledger.campaign")}
            return {k: by_id[cid] for k, cid in ids.items()}

        waited = await ctx.until(lambda: all(states()[k] == "awaiting_approval" for k in asking if k in ids)
                                 and all(ctx.sql("SELECT promoted_at IS NOT NULL AS p FROM ledger.campaign "
                                                 "WHERE id = %s", ids[k])[0]["p"] for k in ("when-b", "never")),
                                 f"{len(ids) - 2} candidates to wait for approval and 2 to be promoted",
                                 timeout=60 + 6 * len(ids))
        for name in timed:
            ids[name] = (await sensor.open_campaign(name, name, "repo")).campaign_id
        waited = waited and await ctx.until(lambda: all(states()[k] == "awaiting_approval" for k in asking),
                                            "the timeout classes' candidates to wait too", timeout=60)
        if not waited:
            raise UnderExercised(f"the candidates did not all reach their approval: {states()}")
        ctx.step(f"{len(asking)} verified candidates wait for a person; when-b and never were promoted "
                 "without asking")
        reasons = {r["id"]: r["reasons"] for r in ctx.sql(
            "SELECT c.objective_key AS id, ap.reasons FROM ledger.approval ap "
            "JOIN ledger.campaign c ON c.id = ap.campaign_id")}
        ctx.expect(reasons.get("when-a", [{}])[0].get("condition") == "paths" and "when-b" not in reasons,
                   "the when class asked for the candidate whose path matched, and only for it",
                   json.dumps(reasons.get("when-a")))

        # --- nothing is held while they wait ---------------------------------
        held = ctx.sql("SELECT count(*) AS n FROM ledger.campaign WHERE state = 'awaiting_approval' "
                       "AND (lease_owner IS NOT NULL OR lease_expires_at IS NOT NULL)")[0]["n"]
        running = ctx.sql("SELECT count(*) AS n FROM ledger.verification v JOIN ledger.campaign c "
                          "ON c.id = v.campaign_id WHERE c.state = 'awaiting_approval' "
                          "AND v.status = 'running'")[0]["n"]

        def holding() -> list[dict[str, Any]]:
            return ctx.sql("SELECT role, holds FROM ledger.process WHERE stopped_at IS NULL "
                           "AND role IN ('worker', 'verifier') AND holds <> '[]'")

        # (each process reports what it holds on its own tick: a verdict given a
        # moment ago may still be listed until the next report)
        await ctx.until(lambda: not holding(), "the workers and the verifier to report holding nothing",
                        timeout=15)
        holds = holding()
        cells = [(p.name, d) for p in procs for d in _descendants(p.pid)
                 if d[1] in ("bwrap", "python3", drill_python().rsplit("/", 1)[-1]) and p.name != "serve"]
        ctx.expect(held == 0 and running == 0 and not holds and not cells,
                   "while they wait: no lease, no verification running, no worker or verifier holding "
                   "anything, no cell left",
                   f"{held} leased, {running} verifying, holds {holds}, processes {cells}")
        extra = (await sensor.open_campaign("never", "never-extra", "repo")).campaign_id
        free = await ctx.until(lambda: ctx.sql("SELECT promoted_at IS NOT NULL AS p FROM ledger.campaign "
                                               "WHERE id = %s", extra)[0]["p"],
                               "a campaign opened now to be attempted, verified and promoted", timeout=60)
        ctx.expect(free, f"the 2 worker slots are free while {len(asking)} candidates wait: one opened now "
                         "was attempted, verified and promoted meanwhile")

        # --- the faults, while they wait ---------------------------------------
        before = ctx.sql("SELECT id, campaign_id, deadline FROM ledger.approval ORDER BY id")
        ctx.restart_server()
        ctx.step("fault: PostgreSQL restarted (fast shutdown) while the candidates wait")
        dispatcher.signal(signal.SIGKILL)
        dispatcher.wait(10)
        ctx.step("fault: SIGKILL dispatcher-1")
        after = ctx.sql("SELECT id, campaign_id, deadline FROM ledger.approval ORDER BY id")
        ctx.expect(after == before and all(states()[k] == "awaiting_approval" for k in asking),
                   "the approvals survived the restart: the same rows, the same deadlines, still waiting")
        dispatcher = ctx.spawn("dispatcher-2", "dispatcher", "--poll", str(DISPATCHER_POLL_S))
        procs.append(dispatcher)
        notices = await ctx.until(lambda: ctx.sql(
            "SELECT count(*) FILTER (WHERE state IN ('pending', 'claimed')) AS open FROM ledger.side_effect "
            "WHERE idempotency_key LIKE 'approval:%%'")[0]["open"] == 0, "every notice to be sent", timeout=60)
        ctx.expect(notices, "every approval's notice left the outbox")
        # dispatcher-2 promotes (a campaign that asks nothing), so that what is
        # measured below is the wake-up, not a new dispatcher's first fetch
        after_kill = (await sensor.open_campaign("never", "never-after-kill", "repo")).campaign_id
        ctx.expect(await ctx.until(lambda: ctx.sql("SELECT promoted_at IS NOT NULL AS p FROM ledger.campaign "
                                                   "WHERE id = %s", after_kill)[0]["p"],
                                   "dispatcher-2 to promote a campaign that asks nothing", timeout=60),
                   "dispatcher-2 promotes after the kill and the restart")

        # --- the decisions ---------------------------------------------------------
        gates = [f"gate-{i}" for i in range(1, n + 1)]
        by_cli, by_http = gates[0::2], gates[1::2]
        deny_cli, abandon_http = by_cli[-1], by_http[-1]
        approve = [g for g in gates if g not in (deny_cli, abandon_http)]
        for verb, keys, why in (("approve", [k for k in by_cli if k != deny_cli], "read the diff"),
                                ("deny", [deny_cli], "not this change")):
            p = ctx.spawn(f"cli-{verb}", verb, *(str(ids[k]) for k in keys), "--reason", why)
            code = await asyncio.to_thread(p.wait, 60)
            ctx.expect(code == 0, f"ledger {verb} {' '.join(keys)} exited 0", p.output()[-300:].strip())
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30,
                                     headers={"Authorization": f"Bearer {token}"}) as client:
            up = await ctx.until(lambda: _live(client), "ledger serve to answer", timeout=30)
            if not up:
                raise RuntimeError("ledger serve never answered:\n" + serve.output()[-2000:])
            for key in by_http + ["when-a"]:
                if key == abandon_http:
                    r = await client.post(f"/campaigns/{ids[key]}/deny",
                                          json={"reason": "not wanted", "abandon": True})
                else:
                    r = await client.post(f"/campaigns/{ids[key]}/approve", json={"reason": "fine"})
                ctx.expect(r.status_code == 200, f"POST {key}'s decision answered 200", r.text[:300])
            twice = await client.post(f"/campaigns/{ids[approve[0]]}/deny", json={"reason": "again"})
            ctx.expect(twice.status_code == 409, "a second decision on a decided approval is refused (409)",
                       twice.text[:200])
        ctx.step(f"decided: {len(by_cli)} by `ledger approve`/`deny`, {len(by_http) + 1} over HTTP; "
                 f"the 3 timeout classes are left to their {TIMEOUT_S:g} s deadline")

        expected = {**{k: "promoted" for k in approve + ["when-a", "timeout-approve"]},
                    deny_cli: "exhausted", "timeout-deny": "exhausted",
                    abandon_http: "abandoned", "timeout-abandon": "abandoned"}

        def outcome(key: str) -> str:
            row = ctx.sql("SELECT state, promoted_at IS NOT NULL AS promoted FROM ledger.campaign WHERE id = %s",
                          ids[key])[0]
            return "promoted" if row["state"] == "verified" and row["promoted"] else str(row["state"])

        settled = await ctx.until(lambda: all(outcome(k) == v for k, v in expected.items()),
                                  "every decision to take effect", timeout=TIMEOUT_S + 60)
        ctx.expect(settled, "each campaign ended as decided: approved ones promoted, denied ones sent back "
                            "(and, their one attempt spent, exhausted), abandoned ones abandoned",
                   str({k: outcome(k) for k in expected if outcome(k) != expected[k]}))

        # --- what must hold --------------------------------------------------------
        approvals = ctx.sql(
            "SELECT c.objective_key AS key, ap.id, ap.generation, ap.decision, ap.decided_by, ap.decided_role, "
            "ap.decided_by_transition AS transition, ap.decided_at, "
            "(SELECT count(*) FROM ledger.campaign_event e WHERE e.campaign_id = ap.campaign_id "
            " AND e.type = 'transition' AND e.payload->>'approval_id' = ap.id::text "
            " AND e.payload->>'transition' <> 'request_approval') AS decisions, "
            "(SELECT count(*) FROM ledger.side_effect s WHERE s.campaign_id = ap.campaign_id "
            " AND s.generation = ap.generation AND s.purpose = 'promotion') AS promotions "
            "FROM ledger.approval ap JOIN ledger.campaign c ON c.id = ap.campaign_id ORDER BY ap.id")
        ctx.expect(sorted(a["key"] for a in approvals) == sorted(asking),
                   f"one approval per candidate that asked ({len(asking)}), none for the others")
        ctx.expect(all(a["decision"] and a["decisions"] == 1 for a in approvals),
                   "every approval was decided, by exactly one journaled decision",
                   str([(a["key"], a["decision"], a["decisions"]) for a in approvals if a["decisions"] != 1]))
        ctx.expect(all(a["promotions"] == (1 if a["decision"] == "approved" else 0) for a in approvals),
                   "each approval applied once: one promotion intent per approved one, none otherwise",
                   str([(a["key"], a["decision"], a["promotions"]) for a in approvals]))
        who = {a["key"]: (a["decided_by"], a["decided_role"], a["transition"]) for a in approvals}
        ctx.expect(all(who[k][0].startswith("cli:") and who[k][1] == "operator" for k in by_cli)
                   and all(who[k] == ("http:drill-operator", "operator", who[k][2]) for k in by_http)
                   and who["timeout-approve"] == ("system", "system", "approve_on_timeout")
                   and who["timeout-deny"] == ("system", "system", "deny_on_timeout")
                   and who["timeout-abandon"] == ("system", "system", "abandon_on_timeout"),
                   "each decision is journaled with who made it: the CLI's user, the HTTP token, the system "
                   "for the timeouts", json.dumps(who))
        unapproved = ctx.sql(
            "SELECT c.objective_key AS key FROM ledger.campaign c WHERE c.promoted_at IS NOT NULL "
            "AND c.class <> 'never' AND NOT (c.class = 'when' AND c.objective_key = 'when-b') "
            "AND NOT EXISTS (SELECT 1 FROM ledger.approval ap WHERE ap.campaign_id = c.id "
            "AND ap.decision = 'approved')")
        ctx.expect(not unapproved, "nothing was promoted without an approval", str(unapproved))
        moved = {}
        for name in classes:
            log = subprocess.run(["git", "-C", str(repo), "reflog", "show", f"refs/heads/{name}"],
                                 capture_output=True, text=True).stdout
            moved[name] = log.count("ledger promotion")
        landed = {"when": 2, "never": 3, **{k: 1 for k in approve}, "timeout-approve": 1,
                  deny_cli: 0, abandon_http: 0, "timeout-deny": 0, "timeout-abandon": 0}
        ctx.expect(moved == landed, "each branch moved once per promoted campaign, and never for a denied one",
                   json.dumps(moved))
        keys = [k for k, _ in hook.received]
        sent = ctx.sql("SELECT idempotency_key, state FROM ledger.side_effect WHERE idempotency_key LIKE 'approval:%%'")
        ctx.expect(len(sent) == len(asking) - 1 and set(keys) == {s["idempotency_key"] for s in sent
                                                                    if s["state"] == "done"}
                   and all(s["state"] == "done" for s in sent),
                   f"one notice per approval of a class with a hook ({len(sent)}), each delivered with its "
                   "own Idempotency-Key", f"{len(keys)} received, {len(set(keys))} keys; states "
                   + str(sorted({s['state'] for s in sent})))

        measured = ctx.sql(
            "SELECT c.objective_key AS key, extract(epoch FROM s.finished_at - ap.decided_at)::float8 AS s, "
            "extract(epoch FROM s.updated_at - s.created_at)::float8 AS queued "
            "FROM ledger.approval ap JOIN ledger.campaign c ON c.id = ap.campaign_id "
            "JOIN ledger.side_effect s ON s.campaign_id = ap.campaign_id AND s.generation = ap.generation "
            "AND s.purpose = 'promotion' WHERE ap.decision = 'approved' AND s.state = 'done' ORDER BY 2 DESC")
        latency = [r["s"] for r in measured]
        if measured:
            ctx.step("slowest: " + ", ".join(f"{r['key']} {r['s'] * 1000:.0f} ms" for r in measured[:3]))
        if latency:
            p50, p99 = statistics.median(latency), _percentile(latency, 0.99)
            ctx.step(f"measured: decision to promotion (the landed commit read back) over {len(latency)} "
                     f"approvals: p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {max(latency) * 1000:.0f} "
                     f"ms (dispatchers poll every {DISPATCHER_POLL_S:g} s: the wake-up did it)")
            ctx.expect(p99 < 1.0, "a decision takes effect within 1 s p99", f"p99 {p99:.3f}s")
        ctx.expect(all(p.popen.poll() is None for p in procs),
                   "every process survived the restart and reconnected by itself",
                   str({p.name: p.popen.poll() for p in procs}))
        for p in procs:
            p.signal(signal.SIGTERM)
        ctx.expect(all(p.wait(30) == 0 for p in procs), "everything stops cleanly")


async def _live(client: httpx.AsyncClient) -> bool:
    try:
        return (await client.get("/livez")).status_code == 200
    except httpx.HTTPError:
        return False
