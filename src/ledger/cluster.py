"""A throwaway PostgreSQL cluster of one's own, to stop, crash and start again
(tests and drills that restart the server: database-restart, chaos).

It is an embedded PostgreSQL (``ledger.embedded``) under a directory of its
own, listening on a Unix socket only; ``stop`` uses ``pg_ctl``'s fast or
immediate mode (immediate: no shutdown checkpoint, so the next start runs
crash recovery), ``start`` waits until the server accepts connections.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Literal

from psycopg.conninfo import conninfo_to_dict

from .embedded import pg_ctl, server_of, server_url

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
