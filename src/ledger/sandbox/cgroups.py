"""A cgroup per cell, wherever the host offers one: the cell's memory and
processes bounded as a whole -- for a worker running as root too, whose
processes ``RLIMIT_NPROC`` does not count -- and its CPU time counted.

The design at length: docs/internals.md (``ledger.sandbox.cgroups``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Mode = Literal["cgroup2", "cgroup1", "rlimits"]
#: The prefix of the cgroups cells run in (the worker's pid follows: a
#: leftover of a dead worker is swept by the next one).
PREFIX = "cell-"
_counter = itertools.count(1)


@dataclass(frozen=True)
class Host:
    """What this host offers: the mode, and the parent directory of a cell's
    cgroup in each hierarchy used (``memory``, ``pids``, ``cpu`` -> path)."""

    mode: Mode
    parents: dict[str, Path] = field(default_factory=dict)
    reason: str = ""


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """(filesystem type, mount point, root within the hierarchy, options) of each cgroup mount."""
    found = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        options = set(tail[2].split(",")) | set(fields[5].split(",") if len(fields) > 5 else [])
        found.append((tail[0], fields[4].replace("\\040", " "), fields[3], options))
    return found


def _memberships(text: str) -> dict[str, str]:
    """Controller (or ``""`` for the unified hierarchy) -> this process's cgroup path."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            found[""] = path
        for name in controllers.split(","):
            if name:
                found[name] = path
    return found


def _within(mount: str, root: str, path: str) -> Path:
    relative = path[len(root):] if root != "/" and path.startswith(root) else path
    return Path(mount) / relative.lstrip("/")


def _writable(directory: Path) -> bool:
    return directory.is_dir() and os.access(directory, os.W_OK | os.X_OK)


def _probe(parent: Path, files: dict[str, str]) -> str | None:
    """Make and remove a cgroup under ``parent`` writing ``files``; ``None`` if that works."""
    probe = parent / f"{PREFIX}{os.getpid()}-probe"
    try:
        probe.mkdir(exist_ok=True)
    except OSError as exc:
        return f"cannot make a cgroup in {parent}: {exc.strerror}"
    try:
        for name, value in files.items():
            (probe / name).write_text(value)
        return None
    except OSError as exc:
        return f"cannot set {name} in {parent}: {exc.strerror}"
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def _v2(mounts: list[tuple[str, str, str, set[str]]], member: dict[str, str]) -> tuple[Host | None, str]:
    unified = next((m for m in mounts if m[0] == "cgroup2"), None)
    if unified is None or "" not in member:
        return None, "no cgroup2 hierarchy"
    own = _within(unified[1], unified[2], member[""])
    reasons = []
    for parent in (own, own.parent):
        try:
            available = set((parent / "cgroup.controllers").read_text().split())
        except OSError:
            reasons.append(f"{parent}: unreadable")
            continue
        if not {"memory", "pids"} <= available:
            reasons.append(f"{parent}: memory and pids not available ({' '.join(sorted(available)) or 'none'})")
            continue
        if not _writable(parent):
            reasons.append(f"{parent}: not writable")
            continue
        try:
            enabled = set((parent / "cgroup.subtree_control").read_text().split())
            if not {"memory", "pids"} <= enabled:
                (parent / "cgroup.subtree_control").write_text("+memory +pids")
        except OSError as exc:
            reasons.append(f"{parent}: cannot enable memory and pids for its children ({exc.strerror})")
            continue
        problem = _probe(parent, {"pids.max": "8", "memory.max": str(64 << 20)})
        if problem is None:
            _sweep({"unified": parent})
            return Host("cgroup2", {"memory": parent, "pids": parent, "cpu": parent}), ""
        reasons.append(problem)
    return None, "cgroup2: " + "; ".join(reasons)


def _v1(mounts: list[tuple[str, str, str, set[str]]], member: dict[str, str]) -> tuple[Host | None, str]:
    parents: dict[str, Path] = {}
    for controller in ("memory", "pids", "cpuacct"):
        mount = next((m for m in mounts if m[0] == "cgroup" and controller in m[3]), None)
        if mount is None or controller not in member:
            if controller != "cpuacct":
                return None, f"no cgroup v1 {controller} hierarchy"
            continue
        directory = _within(mount[1], mount[2], member[controller])
        if not _writable(directory):
            if controller != "cpuacct":
                return None, f"cgroup v1 {controller}: {directory} is not writable"
            continue
        parents["cpu" if controller == "cpuacct" else controller] = directory
    for controller, files in (("memory", {"memory.limit_in_bytes": str(64 << 20)}),
                              ("pids", {"pids.max": "8"})):
        problem = _probe(parents[controller], files)
        if problem is not None:
            return None, f"cgroup v1 {controller}: {problem}"
    if "cpu" in parents and _probe(parents["cpu"], {}) is not None:
        del parents["cpu"]
    _sweep(parents)
    return Host("cgroup1", parents), ""


def _sweep(parents: dict[str, Path]) -> None:
    """Remove the empty cell cgroups of workers that are gone (killed mid-cell)."""
    for parent in set(parents.values()):
        with contextlib.suppress(OSError):
            for child in parent.iterdir():
                name = child.name
                if not name.startswith(PREFIX) or not child.is_dir():
                    continue
                pid = name[len(PREFIX):].split("-", 1)[0]
                if pid.isdigit() and not _alive(int(pid)):
                    with contextlib.suppress(OSError):
                        child.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def detect(mountinfo: str, cgroup: str) -> Host:
    """The mode for a process with this ``/proc/self/mountinfo`` and ``/proc/self/cgroup``."""
    mounts = _mounts(mountinfo)
    v2, why2 = _v2(mounts, _memberships(cgroup))
    if v2 is not None:
        return v2
    v1, why1 = _v1(mounts, _memberships(cgroup))
    if v1 is not None:
        return v1
    return Host("rlimits", reason=f"{why2}; {why1}")


@functools.lru_cache(maxsize=1)
def host() -> Host:
    """This host's mode, probed once per process."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
        cgroup = Path("/proc/self/cgroup").read_text()
    except OSError as exc:
        return Host("rlimits", reason=f"cannot read this process's cgroups: {exc.strerror}")
    return detect(mountinfo, cgroup)


class CellCgroup:
    """One cell's cgroup (in each hierarchy the host's mode uses)."""

    def __init__(self, host: Host, *, memory_bytes: int, processes: int):
        self.host = host
        self.name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.dirs: dict[str, Path] = {}
        made: list[Path] = []
        try:
            for kind, parent in host.parents.items():
                directory = parent / self.name
                if directory not in made:
                    directory.mkdir()
                    made.append(directory)
                self.dirs[kind] = directory
            if host.mode == "cgroup2":
                directory = self.dirs["memory"]
                _write(directory / "memory.max", str(memory_bytes))
                with contextlib.suppress(OSError):  # no swap accounting: nothing to turn off
                    _write(directory / "memory.swap.max", "0")
                _write(directory / "pids.max", str(processes))
            else:
                _write(self.dirs["memory"] / "memory.limit_in_bytes", str(memory_bytes))
                with contextlib.suppress(OSError):  # swap accounting is optional in v1
                    _write(self.dirs["memory"] / "memory.memsw.limit_in_bytes", str(memory_bytes))
                _write(self.dirs["pids"] / "pids.max", str(processes))
        except OSError:
            for directory in made:
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise
        self._procs = [os.fsencode(d / "cgroup.procs") for d in dict.fromkeys(self.dirs.values())]

    def joiner(self) -> Callable[[], None]:
        """A ``preexec_fn`` step: move the forked child (and so all it starts) into the cell's cgroup."""
        paths = list(self._procs)

        def join() -> None:
            pid = str(os.getpid()).encode()
            for path in paths:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, pid)
                finally:
                    os.close(fd)
        return join

    def cpu_seconds(self) -> float | None:
        """CPU time the cell has used so far (``None``: not counted here)."""
        directory = self.dirs.get("cpu")
        if directory is None:
            return None
        try:
            if self.host.mode == "cgroup2":
                stat = _keyed((directory / "cpu.stat").read_text())
                return stat.get("usage_usec", 0) / 1e6
            return int((directory / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None

    def usage(self) -> dict[str, Any]:
        """What the cell used: peak memory (MiB), out-of-memory kills, refused forks, CPU seconds used."""
        found: dict[str, Any] = {}
        memory, pids = self.dirs["memory"], self.dirs["pids"]
        with contextlib.suppress(OSError, ValueError):
            if self.host.mode == "cgroup2":
                with contextlib.suppress(OSError):
                    found["memory_peak_mb"] = round(int((memory / "memory.peak").read_text()) / (1 << 20), 1)
                found["oom_kills"] = _keyed((memory / "memory.events").read_text()).get("oom_kill", 0)
            else:
                found["memory_peak_mb"] = round(int((memory / "memory.max_usage_in_bytes").read_text())
                                                / (1 << 20), 1)
                found["oom_kills"] = _keyed((memory / "memory.oom_control").read_text()).get("oom_kill", 0)
        with contextlib.suppress(OSError, ValueError):
            found["forks_refused"] = _keyed((pids / "pids.events").read_text()).get("max", 0)
        cpu = self.cpu_seconds()
        if cpu is not None:
            found["cpu_used_s"] = round(cpu, 3)
        return found

    def kill(self) -> None:
        """SIGKILL whatever is still in the cgroup."""
        for directory in dict.fromkeys(self.dirs.values()):
            if self.host.mode == "cgroup2":
                with contextlib.suppress(OSError):
                    _write(directory / "cgroup.kill", "1")
                    continue
            with contextlib.suppress(OSError):
                for line in (directory / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError, ValueError):
                        os.kill(int(line), signal.SIGKILL)

    def remove(self, wait_s: float = 5.0) -> bool:
        """Kill what is left and remove the cgroup (retried while its last
        processes exit); whether it is gone."""
        deadline = time.monotonic() + wait_s
        pending = list(dict.fromkeys(self.dirs.values()))
        while pending:
            self.kill()
            for directory in list(pending):
                try:
                    directory.rmdir()
                    pending.remove(directory)
                except FileNotFoundError:
                    pending.remove(directory)
                except OSError:
                    pass
            if pending:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.005)  # a killed process takes a moment to leave its cgroup
        return True


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _keyed(text: str) -> dict[str, int]:
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            found[key] = int(value.strip())
    return found


def for_cell(memory_bytes: int, processes: int) -> tuple[CellCgroup | None, Host]:
    """A cgroup for one cell with these limits, or ``None`` (mode ``rlimits``,
    or the host's cgroups refused this one: the cell then runs on its rlimits,
    and its record says so)."""
    found = host()
    if found.mode == "rlimits":
        return None, found
    try:
        return CellCgroup(found, memory_bytes=memory_bytes, processes=processes), found
    except OSError as exc:
        return None, Host("rlimits", reason=f"{found.mode}: cannot make the cell's cgroup: {exc.strerror}")
