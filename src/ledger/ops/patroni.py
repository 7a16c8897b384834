"""A Patroni-managed PostgreSQL cluster on loopback, to switch over and fail
over for real (the ``patroni`` drill and ``tests/test_patroni.py``).

One etcd member (the DCS: a three-member etcd adds quorum, not realism, to a
drill on one machine) and two PostgreSQL members, each run by its own Patroni
daemon with a REST API, all on 127.0.0.1 under one directory. The members are
Debian's PostgreSQL (``/usr/lib/postgresql/<major>/bin``, the newest there, or
``LEDGER_PATRONI_PG_BIN``): Debian's ``patroni`` package is built and tested
against the distribution's own PostgreSQL, and a Patroni older than the server
misjudges settings it does not know. Run as root, every process runs as the
``postgres`` system user (PostgreSQL refuses root).

The settings are those docs/deployment.md asks of a Ledger deployment:
``synchronous_mode`` (a commit returns once the synchronous standby has it, and
Patroni promotes only that standby, so nothing acknowledged is lost),
``maximum_lag_on_failover: 0`` (no standby that lags is promoted) and
``primary_start_timeout: 0`` (a crashed primary is failed over at once rather
than restarted in place). Ledger connects with ``url``: both members,
``target_session_attrs=read-write``, so libpq finds whichever is the leader.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ledger.ops.cluster import _free_port
from ledger.settings import environment, inherited_environment

SCOPE = "ledger"
#: Patroni's timing: a leader key lives ``TTL`` seconds unless renewed every
#: ``LOOP_WAIT``; the smallest values etcd and Patroni accept together keep the
#: drill's failover short without flapping on a loaded 2-core machine.
TTL = 20
LOOP_WAIT = 1
RETRY_TIMEOUT = 5


def missing() -> str | None:
    """Why a Patroni cluster cannot be made here (``None``: it can)."""
    for tool in ("patroni", "patronictl", "etcd"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install patroni etcd-server)"
    if pg_bin() is None:
        return "no Debian PostgreSQL binaries under /usr/lib/postgresql/*/bin (apt-get install postgresql)"
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root, but there is no postgres system user to run the members as"
    return None


def pg_bin() -> Path | None:
    """The PostgreSQL binaries the members run (``LEDGER_PATRONI_PG_BIN`` or Debian's newest)."""
    chosen = environment("patroni_pg_bin")
    if chosen:
        return Path(chosen) if (Path(chosen) / "postgres").exists() else None
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    return Path(found[-1]).parent if found else None


@dataclass
class Member:
    """One PostgreSQL member and the Patroni daemon that runs it."""

    name: str
    root: Path
    pg_port: int
    rest_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def pgdata(self) -> Path:
        return self.root / self.name

    @property
    def config(self) -> Path:
        return self.root / f"{self.name}.yml"

    @property
    def log(self) -> Path:
        return self.root / f"{self.name}.log"

    @property
    def url(self) -> str:
        """This member alone (as the administrator, database ``postgres``)."""
        return f"host=127.0.0.1 port={self.pg_port} user=postgres dbname=postgres"

    @property
    def rest(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def postmaster(self) -> int | None:
        """The postmaster's pid while its pid file says it runs."""
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class PatroniCluster:
    """etcd and two Patroni members under ``root``, started here; ``close`` stops
    and deletes everything."""

    def __init__(self, root: Path, *, members: int = 2, start_timeout_s: float = 120):
        reason = missing()
        if reason:
            raise RuntimeError(reason)
        bin_dir = pg_bin()
        assert bin_dir is not None
        self.bin_dir = bin_dir
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = "postgres"
            shutil.chown(root, self._user, self._user)
            os.chmod(root, 0o700)
            for folder in root.parents:  # the members' user must be able to reach its directory
                folder.chmod(folder.stat().st_mode | 0o011)
        self.etcd_port, self.etcd_peer_port = _free_port(), _free_port()
        self.members = [Member(f"pg{i + 1}", root, _free_port(), _free_port()) for i in range(members)]
        self._etcd: subprocess.Popen[bytes] | None = None
        try:
            self._start_etcd()
            for i, member in enumerate(self.members):
                self._write_config(member)
                self.start(member)
                if i == 0:  # the first bootstraps; the others copy it once it leads
                    self.wait(lambda: self.leader() is not None, "a leader", start_timeout_s)
            self.wait_healthy(start_timeout_s)
        except BaseException:
            self.close()
            raise

    # -- processes -----------------------------------------------------------

    def _popen(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        out = log.open("ab")
        try:
            # Patroni runs on the system's Python with its own packages: nothing of
            # this process's virtual environment may leak into it.
            env = {k: v for k, v in inherited_environment().items()
                   if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("PG")}
            env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=self.root, env=env,
                                    user=self._user, start_new_session=True)
        finally:
            out.close()

    def _start_etcd(self) -> None:
        data = self.root / "etcd"
        client, peer = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{self.etcd_peer_port}"
        self._etcd = self._popen(["etcd", "--name", "etcd1", "--data-dir", str(data),
                                  "--listen-client-urls", client, "--advertise-client-urls", client,
                                  "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                  "--initial-cluster", f"etcd1={peer}", "--initial-cluster-state", "new",
                                  "--log-level", "warn"], self.root / "etcd.log")
        self.wait(lambda: self._get(f"{client}/health") is not None, "etcd", 30)

    def _write_config(self, member: Member) -> None:
        socket_dir = self.root / f"{member.name}-socket"
        socket_dir.mkdir(exist_ok=True)
        if self._user:
            shutil.chown(socket_dir, self._user, self._user)
        config: dict[str, Any] = {
            "scope": SCOPE, "name": member.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{member.rest_port}",
                        "connect_address": f"127.0.0.1:{member.rest_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
                    # Ledger's settings (docs/deployment.md, "High availability with Patroni"):
                    "synchronous_mode": True,
                    "maximum_lag_on_failover": 0,
                    "primary_start_timeout": 0,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {"wal_level": "replica", "hot_standby": "on", "max_wal_senders": 5,
                                       "max_replication_slots": 5, "wal_log_hints": "on",
                                       "max_connections": 200, "wal_keep_size": "128MB"},
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}, "data-checksums"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{member.pg_port}",
                "connect_address": f"127.0.0.1:{member.pg_port}",
                "data_dir": str(member.pgdata),
                "bin_dir": str(self.bin_dir),
                "pgpass": str(self.root / f"{member.name}.pgpass"),
                "authentication": {"superuser": {"username": "postgres"},
                                   "replication": {"username": "postgres"},
                                   "rewind": {"username": "postgres"}},
                "parameters": {"unix_socket_directories": str(socket_dir)},
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust"],
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }
        member.config.write_text(json.dumps(config, indent=2))  # JSON is YAML
        if self._user:
            shutil.chown(member.config, self._user, self._user)

    def start(self, member: Member) -> None:
        """Start ``member``'s Patroni daemon (it starts or bootstraps PostgreSQL)."""
        member.process = self._popen(["patroni", str(member.config)], member.log)

    # -- the cluster's state (Patroni's REST API) --------------------------------

    @staticmethod
    def _get(url: str) -> Any:
        try:
            response = httpx.get(url, timeout=2)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        try:
            return response.json()
        except ValueError:
            return {}

    def topology(self) -> list[dict[str, Any]]:
        """The members as Patroni reports them (name, role, state, lag, timeline)."""
        for member in self.members:
            got = self._get(f"{member.rest}/cluster")
            if got and "members" in got:
                return list(got["members"])
        return []

    def leader(self) -> Member | None:
        """The member that holds the leader key and runs as primary."""
        for row in self.topology():
            if row.get("role") == "leader" and row.get("state") == "running":
                return self.member(row["name"])
        return None

    def sync_standby(self) -> Member | None:
        """The member Patroni set up as the synchronous standby, once streaming."""
        for row in self.topology():
            if row.get("role") == "sync_standby" and row.get("state") in ("streaming", "running"):
                return self.member(row["name"])
        return None

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    def history(self) -> list[list[Any]]:
        """Patroni's timeline history: [timeline, lsn, reason, timestamp, new leader] rows."""
        for member in self.members:
            got = self._get(f"{member.rest}/history")
            if isinstance(got, list):
                return got
        return []

    def wait(self, check: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {m.name}:\n{m.log_tail()}" for m in self.members)
                raise RuntimeError(f"the Patroni cluster gave no {what} within {timeout:g}s; "
                                   f"topology {self.topology()}\n{logs}")
            time.sleep(0.2)  # Patroni's state has no notification to wait on

    def wait_healthy(self, timeout: float = 120) -> tuple[Member, Member]:
        """Until there is a leader and a streaming synchronous standby; returns both."""
        self.wait(lambda: self.leader() is not None and self.sync_standby() is not None,
                  "leader with a synchronous standby", timeout)
        leader, standby = self.leader(), self.sync_standby()
        assert leader is not None and standby is not None
        return leader, standby

    @property
    def url(self) -> str:
        """Every member, the writable one chosen at each connect (how Ledger connects)."""
        return (f"host={','.join('127.0.0.1' for _ in self.members)} "
                f"port={','.join(str(m.pg_port) for m in self.members)} "
                "user=postgres dbname=postgres target_session_attrs=read-write")

    # -- faults ----------------------------------------------------------------

    def switchover(self, leader: Member, candidate: Member, timeout: float = 60) -> str:
        """A planned switchover (``patronictl switchover``); returns its output."""
        done = subprocess.run(["patronictl", "-c", str(leader.config), "switchover", "--leader", leader.name,
                               "--candidate", candidate.name, "--force"],
                              capture_output=True, text=True, timeout=timeout, cwd=self.root,
                              env={**inherited_environment(), "PATH": "/usr/local/bin:/usr/bin:/bin"})
        if done.returncode != 0:
            raise RuntimeError(f"patronictl switchover failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done.stdout.strip()

    def kill_postmaster(self, member: Member) -> int:
        """SIGKILL ``member``'s postmaster and every process of it at once (the
        server dying; its Patroni lives on and sees it). Returns how many died."""
        import psutil

        pid = member.postmaster()
        if pid is None:
            return 0
        try:
            master = psutil.Process(pid)
            victims = [master, *master.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        for p in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(victims, timeout=10)
        return len(victims)

    def close(self) -> None:
        """Stop every daemon (Patroni first, so none restarts its server) and delete it all."""
        import psutil

        for member in self.members:
            if member.process is not None and member.process.poll() is None:
                member.process.send_signal(signal.SIGTERM)  # Patroni stops its PostgreSQL
        for member in self.members:
            if member.process is not None:
                try:
                    member.process.wait(30)
                except subprocess.TimeoutExpired:
                    member.process.kill()
                    member.process.wait()
            pid = member.postmaster()
            if pid is not None and psutil.pid_exists(pid):  # left behind by a killed Patroni
                with contextlib.suppress(psutil.NoSuchProcess):
                    victims = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
                    for p in victims:
                        p.kill()
                    psutil.wait_procs(victims, timeout=10)
        if self._etcd is not None and self._etcd.poll() is None:
            self._etcd.terminate()
            try:
                self._etcd.wait(10)
            except subprocess.TimeoutExpired:
                self._etcd.kill()
                self._etcd.wait()
        shutil.rmtree(self.root, ignore_errors=True)
