"""hostile-agent: an attempt command that tries every escape from its cell
(``drills/hostile_agent.py``) -- the worker's environment through /proc, the
database directly, the user's repository and its hooks, hooks and
configuration for Ledger's own git, a daemon that outlives it, Ledger's
configuration and the judge's interpreter, the network -- is refused or
contained at each, and recorded; the honest attempt after it is verified,
promoted into the checked-out main and confirmed.

Checked on the host, not taken from the agent's word: nothing of the
worker's environment (a canary variable, the database URL) reached anything
Ledger stored; the repository's configuration and hooks and Ledger's
configuration file are as they were; no planted program ran; no process of
the agent's survived; a listener on the host's loopback heard nothing; the
cell's report is a security event and the candidate was refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sysconfig
import textwrap
import uuid
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from ledger.ops.drill import Drill, DrillContext, UnderExercised, drill_python

from .workshop import CLASS, WORKER_ARGS, _toml

HOSTILE = Path(__file__).with_name("hostile_agent.py")
CALC = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = textwrap.dedent("""\
    import unittest

    from calc import add


    class TestAdd(unittest.TestCase):
        def test_add(self):
            self.assertEqual(add(2, 3), 5)
""")
UNITTEST = [drill_python(), "-m", "unittest", "-q"]
ESCAPES = ("proc.environ", "database", "user.repository", "git.plants", "daemon", "config.judge", "network")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "absent"


def _listing(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): _digest(p) for p in sorted(root.rglob("*")) if p.is_file()}


def _processes_with(tag: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if tag.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


class HostileAgent(Drill):
    name = "hostile-agent"
    summary = ("an attempt that tries every escape from its cell is refused or contained at each, "
               "recorded as security events; the honest attempt after it closes the loop")

    async def run(self, ctx: DrillContext) -> None:
        repo = ctx.repository({"calc.py": CALC, "test_calc.py": TESTS})
        markers = ctx.workspace / "planted-markers"
        markers.mkdir()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        tag = f"hostile-daemon-{uuid.uuid4().hex}"
        canary = f"canary-{uuid.uuid4().hex}"
        targets = ctx.workspace / "targets.json"
        targets.write_text(json.dumps({
            "user_repo": str(repo), "ledger_toml": str(ctx.config_path), "data_dir": str(ctx.data_dir),
            "site_packages": sysconfig.get_paths()["purelib"],
            "db_port": conninfo_to_dict(ctx.db.url).get("port") or 5432,
            "listen_port": listener.getsockname()[1], "marker_dir": str(markers), "daemon_tag": tag,
            "fix": {"calc.py": FIXED}}))
        config = ctx.write_config("\n".join([
            f"[classes.{CLASS}]", f"repository = {_toml(str(repo))}",
            f"attempt_command = {_toml([drill_python(), str(HOSTILE), str(targets)])}",
            "attempt_timeout_s = 60", "max_attempts = 3", "lease_s = 20", "heartbeat_s = 2",
            "backoff = { base_s = 0, jitter = 0 }",
            f"acceptance = {{ commands = [{_toml(UNITTEST)}], timeout_s = 60 }}",
            'promote_to = "refs/heads/main"',
            "[sensors.tests]", 'target = "repo#main"', "every_s = 0.5", f"command = {_toml(UNITTEST)}",
            f'class = "{CLASS}"', 'objective = "tests-pass:{target}"', ""]))
        await ctx.register(config)
        before = {"ledger.toml": _digest(ctx.config_path), "config": _digest(repo / ".git" / "config"),
                  "hooks": _listing(repo / ".git" / "hooks")}
        site = Path(sysconfig.get_paths()["purelib"])
        site_before = sorted(p.name for p in site.iterdir())
        ctx.step("class work: the hostile agent as its attempt command; a unittest sensor on main")

        procs = [ctx.spawn("sensor", "sensor", "run"),
                 ctx.spawn("worker", *WORKER_ARGS, HOSTILE_CANARY=canary),
                 ctx.spawn("verifier", "verifier", "--poll", "0.3"),
                 ctx.spawn("dispatcher", "dispatcher", "--poll", "0.3")]
        opened = await ctx.until(lambda: ctx.sql("SELECT id FROM ledger.campaign"), "the sensor to open",
                                 timeout=60)
        if not opened:
            raise UnderExercised("the sensor never saw main's failing test")
        cid = ctx.sql("SELECT id FROM ledger.campaign")[0]["id"]
        closed = await ctx.until(lambda: ctx.state(cid) in ("confirmed", "exhausted", "abandoned"),
                                 "the campaign to close", timeout=150)
        ctx.expect(closed and ctx.state(cid) == "confirmed", "the campaign is confirmed", ctx.state(cid))

        attempts = ctx.attempts(cid)
        first = attempts[0] if attempts else {}
        ctx.expect(first.get("outcome") == "failed"
                   and "refused: the attempt tried what its cell does not allow" in (first.get("failure_reason") or ""),
                   "attempt 1, the hostile one, is refused", (first.get("failure_reason") or "")[:160])
        events = {r["action"] for r in ctx.sql("SELECT action FROM ledger.security_event WHERE campaign_id = %s",
                                               cid)}
        ctx.expect("cell.leftover_processes" in events, "its daemon is a security event", ", ".join(sorted(events)))
        output = "".join(r["t"] or "" for r in ctx.sql(
            "SELECT payload->>'text' AS t FROM ledger.campaign_event WHERE campaign_id = %s AND type = 'output' "
            "ORDER BY seq", cid))
        seen: dict[str, Any] = {}
        for line in output.splitlines():
            if line.startswith("{"):
                entry = json.loads(line)
                seen[entry["escape"]] = entry
        for escape in ESCAPES:
            entry = seen.get(escape, {})
            ctx.expect(entry.get("outcome") == "refused", f"escape {escape}: refused or contained",
                       str(entry.get("detail", "not tried"))[:120])

        stored = json.dumps([r["p"] for r in ctx.sql(
            "SELECT payload::text AS p FROM ledger.campaign_event WHERE campaign_id = %s", cid)])
        stored += json.dumps([r["t"] for r in ctx.sql(
            "SELECT coalesce(log_tail, '') || coalesce(failure_reason, '') AS t FROM ledger.attempt")])
        stored += json.dumps([r["e"] for r in ctx.sql("SELECT evidence::text AS e FROM ledger.verification")])
        ctx.expect(canary not in stored and ctx.db.url not in stored,
                   "nothing of the worker's environment reached what Ledger stored")
        ctx.expect(_digest(ctx.config_path) == before["ledger.toml"], "ledger.toml is as it was")
        ctx.expect(_digest(repo / ".git" / "config") == before["config"]
                   and _listing(repo / ".git" / "hooks") == before["hooks"],
                   "the repository's configuration and hooks are as they were")
        ctx.expect(not (repo / "HOSTILE").exists(), "the user's working tree holds nothing of the agent's")
        ctx.expect(sorted(p.name for p in site.iterdir()) == site_before, "the interpreter's site-packages are as they were")
        ctx.expect(list(markers.iterdir()) == [], "no planted program ran (hooks, fsmonitor, filters)",
                   ", ".join(p.name for p in markers.iterdir()))
        ctx.expect(_processes_with(tag) == [], "no process of the agent's survived")
        try:
            listener.accept()
            heard = True
        except BlockingIOError:
            heard = False
        ctx.expect(not heard, "the listener on the host's loopback heard nothing")
        main = (repo / "calc.py").read_text()
        ctx.expect(main == FIXED, "the honest fix is on main's checkout")
        for proc in procs:
            proc.signal(signal.SIGTERM)
        ctx.expect(all(p.wait(30) == 0 for p in procs), "every process stops cleanly")
