"""machines: a worker, a verifier, a dispatcher and a sensor, each a ledger
process on a machine of its own (a network namespace, when this host can make
them), sharing nothing but PostgreSQL and a git remote -> a regression pushed
to the remote is opened, fixed, verified, promoted onto the remote and
confirmed; the remote then goes down while a candidate awaits its verdict:
the campaign waits, charged nothing, and closes when the remote returns.
Meanwhile a second sensor's check tries to reach the remote itself from its
cell (no network) and never can: it records errors, and opens nothing.

Each machine has its own ``LEDGER_DATA_DIR``, ``HOME``, ``TMPDIR``, copy of
``ledger.toml`` and (for the authenticated transport) credential file; no
path is shared. In a network namespace (``ledger.ops.netns``) a machine reaches
only the bridge's address, where a forwarder to PostgreSQL
(``ledger.ops.faultproxy``) and the git server (``ledger.ops.gitserver``: git daemon
for ``git://``, http-backend behind basic authentication for ``http://``)
listen -- not this host's loopback. The remote's credentials reach Ledger's
trusted git only (``LEDGER_GIT_CREDENTIAL_HELPER``); the attempt itself tries
to fetch and push the remote and to read the worker's credential file, and
can do neither.

Measured: break (the regression pushed) -> confirmed across the machines,
for the plain round and for the round with the outage (and remote back ->
confirmed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from ledger.db.reads import Reads
from ledger.drills.paths import scripted_attempt
from ledger.ops import netns
from ledger.ops.drill import Drill, DrillContext, Proc, drill_python
from ledger.ops.faultproxy import FaultProxy
from ledger.ops.gitserver import GitDaemon, GitServer, HttpGitServer, bare_repository, push_change

from .workshop import content_check

ROLES = ("worker", "verifier", "dispatcher", "sensor")
#: The name prefix of the sensor whose check reaches for the remote itself.
REACH = "reach-"
GOOD = "good\n"


@dataclass
class Host:
    """One machine: its directories, its network namespace (if any) and the
    URL it reaches PostgreSQL by."""

    name: str
    root: Path
    database_url: str
    machine: netns.Machine | None = None
    credentials: Path | None = None

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def config(self) -> Path:
        return self.root / "ledger.toml"

    def env(self, role_prefix: str) -> dict[str, str]:
        """Its whole environment: nothing of the drill's process but PATH and locale."""
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TZ") or k.startswith("LC_")}
        for sub in ("home", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        env.update(HOME=str(self.root / "home"), TMPDIR=str(self.root / "tmp"),
                   LEDGER_DATABASE_URL=self.database_url, LEDGER_ROLE_PREFIX=role_prefix,
                   LEDGER_DATA_DIR=str(self.data_dir), LEDGER_CONFIG=str(self.config),
                   LEDGER_LOG_LEVEL="info", NO_COLOR="1")
        if self.credentials is not None:
            env["LEDGER_GIT_CREDENTIAL_HELPER"] = f"store --file={self.credentials}"
        return env

    def argv(self, *args: str) -> list[str]:
        argv = [sys.executable, "-m", "ledger", *args]
        return self.machine.command(argv) if self.machine is not None else argv


@dataclass
class Round:
    """What one transport's round measured."""

    transport: str
    break_to_confirmed_s: float | None = None
    outage_break_to_confirmed_s: float | None = None
    back_to_confirmed_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Machines(Drill):
    name = "machines"
    summary = ("worker, verifier, dispatcher, sensor on machines of their own sharing only PostgreSQL and a "
               "git remote (git:// and authenticated http) -> a regression is fixed, promoted onto the "
               "remote and confirmed; the remote down mid-verification: the campaign waits, uncharged, "
               "and closes when it returns")

    def __init__(self, transports: tuple[str, ...] = ("git", "http")):
        self.transports = transports
        self.rounds: list[Round] = []
        #: how the machines were separated ("network namespaces" or "loopback")
        self.isolation = ""

    def timeout_s(self, scale: float, minutes: float | None) -> float:
        return 180.0 * len(self.transports)

    async def run(self, ctx: DrillContext) -> None:
        why_not = netns.available()
        network = netns.Network() if why_not is None else None
        self.isolation = ("network namespaces on a bridge" if network is not None
                          else f"this host's loopback ({why_not})")
        ctx.step(f"machines: {self.isolation}")
        host = network.host if network is not None else "127.0.0.1"
        proxy = FaultProxy.before(ctx.db.url, listen=host) if network is not None else None
        try:
            machines = {role: network.machine(role) if network is not None else None for role in ROLES}
            database_url = proxy.url(ctx.db.url) if proxy is not None else ctx.db.url
            server = conninfo_to_dict(ctx.db.url)
            if network is not None and not str(server.get("host", "")).startswith("/"):
                # The machine's own loopback is not this host's: PostgreSQL only over the bridge.
                probe = (f"import socket; s = socket.socket(); s.settimeout(5); "
                         f"print(s.connect_ex(('127.0.0.1', {int(server.get('port') or 5432)})))")
                machine = machines["worker"]
                assert machine is not None
                seen = subprocess.run(machine.command([sys.executable, "-c", probe]), capture_output=True,
                                      text=True, timeout=60).stdout.strip()
                ctx.expect(seen not in ("", "0"), "a machine does not reach this host's PostgreSQL on "
                           f"127.0.0.1, only through the bridge ({database_url.split('host=')[-1]})",
                           f"connect_ex -> {seen}")
            for transport in self.transports:
                await self._round(ctx, transport, host, machines, database_url)
        finally:
            for proc in ctx.procs:
                if proc.popen.poll() is None:
                    proc.signal(signal.SIGCONT)
                    proc.popen.kill()
                    proc.popen.wait()
            if proxy is not None:
                proxy.stop()
            if network is not None:
                network.close()

    # -- one round ---------------------------------------------------------------

    async def _round(self, ctx: DrillContext, transport: str, host: str,
                     machines: dict[str, netns.Machine | None], database_url: str) -> None:
        measured = Round(transport)
        self.rounds.append(measured)
        served = ctx.workspace / f"served-{transport}"
        served.mkdir()
        name = f"app-{transport}"
        bare = bare_repository(served, f"{name}.git", {"value.txt": GOOD, "README": "an app\n"})
        server: GitServer = GitDaemon(served, host=host) if transport == "git" else HttpGitServer(served, host=host)
        server.start()
        url = server.url(f"{name}.git")
        ctx.step(f"[{transport}] remote {url} ({'basic authentication' if transport == 'http' else 'no authentication'})")
        hosts = {role: Host(role, ctx.workspace / "machines" / transport / role, database_url, machines[role])
                 for role in ROLES}
        user_credentials = None
        if isinstance(server, HttpGitServer):
            for h in hosts.values():
                h.credentials = server.credentials(h.root / "git-credentials")
            user_credentials = server.credentials(ctx.workspace / f"developer-{transport}-credentials")
        worker = hosts["worker"]
        markers = worker.root / "markers"
        markers.mkdir(parents=True)
        plan = markers / "plan.json"
        secret = worker.credentials or (worker.root / "no-credentials-here")
        plan.write_text(json.dumps({"default": [["probe-remote", url, str(secret)],
                                                ["write", "value.txt", GOOD], ["exit", 0]]}))
        cls = f"fix-{transport}"
        config = "\n".join([
            f"[classes.{cls}]",
            f"repository = {json.dumps(url)}",
            'base_ref = "main"',
            f"attempt_command = {json.dumps([drill_python(), str(scripted_attempt()), str(plan)])}",
            "attempt_timeout_s = 60", "max_attempts = 3", "lease_s = 10", "heartbeat_s = 1",
            "backoff = { base_s = 0, jitter = 0 }",
            f"acceptance = {{ commands = {json.dumps([content_check('value.txt', GOOD)])}, timeout_s = 30 }}",
            'promote_to = "refs/heads/main"',
            'authority.worker = { refs = ["refs/heads/ledger/*"] }',
            f"cell = {{ writable = {json.dumps([str(markers)])} }}",
            f"[sensors.{name}]",
            f'target = "{name}#main"', "every_s = 1",
            f"command = {json.dumps(content_check('value.txt', GOOD))}",
            f'class = "{cls}"',
            # a check that fetches the remote itself, from a cell without a
            # network: it can never reach it (git's "fatal: unable to ...")
            f"[sensors.{REACH}{name}]",
            f'target = "{name}#main"', "every_s = 1", "checkout = false",
            f"command = {json.dumps(['git', 'ls-remote', url, 'refs/heads/main'])}",
            f'class = "{cls}"', "",
        ])
        for h in hosts.values():  # each machine its own copy: no path is shared
            h.root.mkdir(parents=True, exist_ok=True)
            h.config.write_text(config)
        procs: dict[str, Proc] = {}
        try:
            synced = subprocess.run(hosts["dispatcher"].argv("classes", "sync"),
                                    env=hosts["dispatcher"].env(ctx.db.role_prefix),
                                    capture_output=True, text=True, timeout=120)
            ctx.expect(synced.returncode == 0, f"[{transport}] ledger classes sync on the dispatcher's machine "
                       "checks the remote and registers the class", synced.stderr.strip()[-300:])
            if synced.returncode != 0:
                raise RuntimeError(f"classes sync failed: {synced.stderr.strip()}")
            args = {"worker": ("worker", "--poll", "0.3", "--grace", "0.5"),
                    "verifier": ("verifier", "--poll", "0.3", "--lease", "10"),
                    "dispatcher": ("dispatcher", "--poll", "0.3"),
                    "sensor": ("sensor", "run")}
            for role in ROLES:
                procs[role] = self._spawn(ctx, f"{transport}-{role}", hosts[role], args[role])

            # -- a regression, closed across the machines ------------------------------
            broke = time.monotonic()
            push_change(url, {"value.txt": "bad\n"}, "a regression", credentials=user_credentials)
            ctx.step(f"[{transport}] fault: a regression pushed to the remote's main")
            first = await self._opened(ctx, cls, None)
            confirmed = await ctx.until(lambda: ctx.state(first) == "confirmed",
                                        f"[{transport}] campaign {first} to be confirmed", timeout=90)
            measured.break_to_confirmed_s = round(time.monotonic() - broke, 2)
            ctx.expect(confirmed, f"[{transport}] the sensor opened campaign {first}, the worker fixed it, the "
                       "verifier accepted it, the dispatcher promoted it onto the remote and the sensor "
                       "confirmed it", f"break -> confirmed {measured.break_to_confirmed_s}s")
            if not confirmed:
                raise RuntimeError(f"campaign {first} never closed: {ctx.attempts(first)}")
            self._check_closed(ctx, transport, first, bare, hosts, markers)
            await self._check_unreachable(ctx, transport, name, cls)

            # -- the remote down while the candidate awaits its verdict --------------------
            procs["verifier"].signal(signal.SIGSTOP)
            ctx.step(f"[{transport}] verifier held (SIGSTOP) so the outage meets the verification")
            broke = time.monotonic()
            push_change(url, {"value.txt": "worse\n"}, "another regression", credentials=user_credentials)
            second = await self._opened(ctx, cls, first)
            recorded = await ctx.until(lambda: ctx.state(second) == "attempted",
                                       f"[{transport}] campaign {second}'s candidate to be recorded", timeout=60)
            if not recorded:
                raise RuntimeError(f"campaign {second} was never attempted: {ctx.attempts(second)}")
            before = self._campaign(ctx, second)
            server.stop()
            down = time.monotonic()
            ctx.step(f"[{transport}] fault: the remote is down (its server stopped); verifier continued")
            procs["verifier"].signal(signal.SIGCONT)
            waited = await ctx.until(
                lambda: self._campaign(ctx, second)["fault_count"] >= 2,
                f"[{transport}] the verification to be released twice on the outage", timeout=60)
            during = self._campaign(ctx, second)
            ctx.expect(waited and during["waiting_on"] == "system_fault" and during["state"] == "attempted",
                       f"[{transport}] the campaign waits on a system fault, its verification released "
                       "and retried", f"{during['fault_count']} release(s): {during['waiting_reason']}")
            ctx.expect(during["attempt_count"] == before["attempt_count"] == 1,
                       f"[{transport}] the outage charged nothing (attempt_count stays 1)",
                       f"{before['attempt_count']} -> {during['attempt_count']}")
            verdicts = self._verifications(ctx, second)
            ctx.expect("rejected" not in verdicts and verdicts.count("released") >= 2,
                       f"[{transport}] no verdict on the candidate while the remote is down", str(verdicts))
            async with ctx.db.session("reader", max_size=1) as session:
                waiting = await Reads(session).waiting_counts()
            ctx.expect(waiting.get((cls, "system_fault"), (0, 0.0))[0] == 1,
                       f"[{transport}] the waiting gauge counts it (reason system_fault)", str(waiting))

            server.start()
            back = time.monotonic()
            ctx.step(f"[{transport}] the remote is back after {back - down:.1f}s")
            closed = await ctx.until(lambda: ctx.state(second) == "confirmed",
                                     f"[{transport}] campaign {second} to be confirmed", timeout=90)
            measured.outage_break_to_confirmed_s = round(time.monotonic() - broke, 2)
            measured.back_to_confirmed_s = round(time.monotonic() - back, 2)
            after = self._campaign(ctx, second)
            verdicts = self._verifications(ctx, second)
            ctx.expect(closed, f"[{transport}] campaign {second} closed once the remote returned",
                       f"remote back -> confirmed {measured.back_to_confirmed_s}s, break -> confirmed "
                       f"{measured.outage_break_to_confirmed_s}s")
            attempts = ctx.attempts(second)
            ctx.expect(after["attempt_count"] == 1 and [a["outcome"] for a in attempts] == ["attempted"]
                       and verdicts.count("accepted") == 1 and "rejected" not in verdicts,
                       f"[{transport}] one attempt, accepted after the outage; no rejected approach",
                       f"attempts {[(a['attempt_no'], a['outcome'], a['verdict']) for a in attempts]}, "
                       f"verifications {verdicts}")
            ctx.expect(after["waiting_on"] is None, f"[{transport}] it no longer waits")
            if isinstance(server, HttpGitServer):
                ctx.expect(server.requests[server.user] > 0,
                           f"[{transport}] every role reached the remote with credentials",
                           str(dict(server.requests)))
            for role in ROLES:
                procs[role].signal(signal.SIGTERM)
            codes = {role: procs[role].wait(30) for role in ROLES}
            ctx.expect(all(code == 0 for code in codes.values()), f"[{transport}] every machine stops cleanly",
                       str(codes))
        finally:
            for proc in procs.values():
                if proc.popen.poll() is None:
                    proc.signal(signal.SIGCONT)
                    proc.popen.kill()
                    proc.popen.wait()
            server.close()

    # -- helpers -------------------------------------------------------------------

    def _spawn(self, ctx: DrillContext, name: str, host: Host, args: tuple[str, ...]) -> Proc:
        log = ctx.workspace / f"{name}.log"
        popen = subprocess.Popen(host.argv(*args), env=host.env(ctx.db.role_prefix), cwd=host.root,
                                 stdout=log.open("ab"), stderr=subprocess.STDOUT)
        proc = Proc(name, popen, log)
        ctx.procs.append(proc)
        where = f"netns {host.machine.netns}" if host.machine else "loopback"
        ctx.step(f"started {name} (pid {popen.pid}, {where}, data dir {host.data_dir}): ledger {' '.join(args)}")
        return proc

    async def _opened(self, ctx: DrillContext, cls: str, after: int | None) -> int:
        def found() -> int | None:
            rows = ctx.sql("SELECT id FROM ledger.campaign WHERE class = %s AND id > %s ORDER BY id",
                           cls, after or 0)
            return rows[0]["id"] if rows else None
        if not await ctx.until(lambda: found() is not None, "the sensor to open a campaign", timeout=60):
            raise RuntimeError("the sensor opened no campaign for the regression")
        cid = found()
        assert cid is not None
        ctx.step(f"the sensor opened campaign {cid}")
        return cid

    async def _check_unreachable(self, ctx: DrillContext, transport: str, name: str, cls: str) -> None:
        """A sensor whose check cannot reach its remote used to record a red,
        open a campaign on a green main and have the agent paid three times
        for changing nothing, until the campaign was exhausted."""
        sensor = f"{REACH}{name}"

        def errors() -> list[dict[str, Any]]:
            return ctx.sql("SELECT status, reason FROM ledger.observation WHERE sensor = %s ORDER BY id", sensor)
        await ctx.until(lambda: len(errors()) >= 3, f"[{transport}] three observations of {sensor}", timeout=30)
        seen = errors()
        opened = ctx.sql("SELECT id, state FROM ledger.campaign WHERE objective_key = %s", f"{sensor}:{name}#main")
        exhausted = ctx.sql("SELECT id FROM ledger.campaign WHERE class = %s AND state = 'exhausted'", cls)
        ctx.expect(len(seen) >= 3 and {r["status"] for r in seen} == {"error"} and not opened and not exhausted,
                   f"[{transport}] a check that cannot reach its remote records errors and opens nothing: "
                   "no campaign, no agent paid, nothing exhausted",
                   f"{len(seen)} error(s), the last: {(seen[-1]['reason'] or '')[:160] if seen else '-'}; "
                   f"campaigns {opened}")

    def _campaign(self, ctx: DrillContext, cid: int) -> dict[str, Any]:
        return ctx.sql("SELECT state, attempt_count, waiting_on, waiting_reason, fault_count "
                       "FROM ledger.campaign WHERE id = %s", cid)[0]

    def _verifications(self, ctx: DrillContext, cid: int) -> list[str]:
        return [r["status"] for r in ctx.sql("SELECT status FROM ledger.verification WHERE campaign_id = %s "
                                             "ORDER BY id", cid)]

    def _check_closed(self, ctx: DrillContext, transport: str, cid: int, bare: Path, hosts: dict[str, Host],
                      markers: Path) -> None:
        def on_remote(*args: str) -> str:
            return subprocess.run(["git", "-C", str(bare), *args], capture_output=True, text=True).stdout.strip()
        message = on_remote("log", "-1", "--format=%B", "refs/heads/main")
        ctx.expect(on_remote("show", "refs/heads/main:value.txt") + "\n" == GOOD
                   and f"Ledger-Campaign: {cid}" in message,
                   f"[{transport}] the remote's main carries the fix, landed by Ledger", message.splitlines()[-1])
        attempt = ctx.sql("SELECT attempt_no, candidate_sha, candidate_ref FROM ledger.attempt WHERE campaign_id = %s",
                          cid)[0]
        ctx.expect(on_remote("rev-parse", attempt["candidate_ref"]) == attempt["candidate_sha"],
                   f"[{transport}] the worker published the candidate on the remote", attempt["candidate_ref"])
        caches = {role: (hosts[role].data_dir / "repos").is_dir() for role in ("worker", "verifier", "dispatcher",
                                                                                 "sensor")}
        ctx.expect(all(caches.values()), f"[{transport}] each role worked through a cache of its own", str(caches))
        probe = markers / f"remote-{cid}-{attempt['attempt_no']}.json"
        seen = json.loads(probe.read_text()) if probe.exists() else {}
        ctx.expect(bool(seen) and seen["fetch"]["exit"] != 0 and seen["push"]["exit"] != 0
                   and seen["credential_variables"] == [] and seen["secret"] != "read",
                   f"[{transport}] the attempt could neither fetch nor push the remote, nor find its credentials",
                   f"fetch: {seen.get('fetch', {}).get('said', '?')[-80:]}; secret: {seen.get('secret')}")
