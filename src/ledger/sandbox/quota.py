"""The watch over a running cell: how much its workspace has grown, how much
CPU time it has used, and the cell killed at either limit.

The design at length: docs/internals.md (``ledger.sandbox.quota``).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ledger.sandbox.cgroups import CellCgroup

TICK_S = 0.1
RECOUNT_S = 5.0


def allocated(roots: Sequence[Path]) -> int:
    """Bytes allocated on disk under ``roots`` (links not followed, a
    hard-linked file counted once). A directory the command made unreadable
    is opened up to be counted (it is the worker's own)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    stack = [str(r) for r in roots]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except PermissionError:
            try:
                os.chmod(directory, 0o700)
                entries = list(os.scandir(directory))
            except OSError:
                continue
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                key = (info.st_dev, info.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            total += info.st_blocks * 512
            if stat.S_ISDIR(info.st_mode):
                stack.append(entry.path)
    return total


def _free(roots: Sequence[Path]) -> dict[int, int]:
    """Free bytes of each filesystem the roots are on (by device)."""
    found: dict[int, int] = {}
    for root in roots:
        with contextlib.suppress(OSError):
            device = os.stat(root).st_dev
            if device not in found:
                info = os.statvfs(root)
                found[device] = info.f_bfree * info.f_frsize
    return found


class Watch:
    """Watches one cell from a thread (``start`` after the command started,
    ``stop`` when it has ended); ``kill`` is called at most once, at a limit."""

    def __init__(self, roots: Sequence[Path], *, workspace_bytes: int | None, cgroup: CellCgroup | None,
                 cpu_s: float | None, kill: Callable[[], None], tick_s: float = TICK_S,
                 recount_s: float = RECOUNT_S):
        self.roots = [Path(r) for r in roots]
        self.workspace_bytes = workspace_bytes if self.roots else None
        self.cgroup = cgroup
        self.cpu_s = cpu_s if cgroup is not None and cgroup.cpu_seconds() is not None else None
        self.kill = kill
        self.tick_s = tick_s
        self.recount_s = recount_s
        self.exceeded: str | None = None
        self.counts = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.start_bytes = allocated(self.roots) if self.workspace_bytes is not None else 0
        self.peak_bytes = self.start_bytes
        self._free_then = _free(self.roots) if self.workspace_bytes is not None else {}
        self._counted_at = time.monotonic()
        self._last_count_s = 0.0

    @property
    def needed(self) -> bool:
        return self.workspace_bytes is not None or self.cpu_s is not None

    def start(self) -> None:
        if self.needed:
            self._thread = threading.Thread(target=self._run, name="cell-watch", daemon=True)
            self._thread.start()

    def stop(self) -> dict[str, Any]:
        """Stop watching; what was seen (for the command's record)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        found: dict[str, Any] = {}
        if self.workspace_bytes is not None:
            found.update(workspace_start_mb=round(self.start_bytes / (1 << 20), 1),
                         workspace_peak_mb=round(self.peak_bytes / (1 << 20), 1))
        if self.exceeded:
            found["exceeded"] = self.exceeded
        return found

    def _count(self) -> int:
        self._free_then = _free(self.roots)  # before the count: what is written meanwhile is "gone" next
        t0 = time.monotonic()
        used = allocated(self.roots)
        self._last_count_s = time.monotonic() - t0
        self._counted_at = time.monotonic()
        self.counts += 1
        self.peak_bytes = max(self.peak_bytes, used)
        return used

    def _run(self) -> None:
        used = self.start_bytes
        while not self._stop.wait(self.tick_s):
            if self.cpu_s is not None and self.cgroup is not None:
                spent = self.cgroup.cpu_seconds()
                if spent is not None and spent > self.cpu_s:
                    self._limit("cpu")
                    return
            if self.workspace_bytes is None:
                continue
            now = _free(self.roots)
            gone = sum(max(0, self._free_then.get(d, free) - free) for d, free in now.items())
            due = time.monotonic() - self._counted_at > max(self.recount_s, 20 * self._last_count_s)
            if used + gone - self.start_bytes > self.workspace_bytes or due:
                used = self._count()
                if used - self.start_bytes > self.workspace_bytes:
                    self._limit("workspace")
                    return

    def _limit(self, which: str) -> None:
        self.exceeded = which
        with contextlib.suppress(Exception):
            self.kill()
