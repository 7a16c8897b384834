"""Running the commands Ledger does not trust -- attempt commands,
acceptance commands and sensor checks: in a cell (``ledger.sandbox.cell``) unless a
class opted out, one process group per command, a deadline, a bounded tail of
the output, and nothing left running afterwards.

Every command starts in a new session (its own process group), so a timeout --
or its runtime being told to stop -- kills the command *and everything it
started* with one ``killpg``. The group is also killed after a normal exit, so
a test suite that leaves a daemon behind cannot outlive its verdict. On Linux
the command also dies with its parent: a SIGKILLed worker leaves no orphan.

Commands get an allow-listed environment (``child_environment``): ``PATH``,
``HOME``, the locale (``LANG``, ``LANGUAGE``, ``LC_*``), ``TZ``, a private
temporary directory made for the command and removed after it, and the extras
a class or sensor names. Nothing else of Ledger's environment -- database URLs,
``PG*`` settings, API tokens, cloud credentials -- reaches an attempt, a
candidate's tests or a sensor check, and no configuration can pass ``LEDGER_*``
or ``PG*`` variables on.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledger.sandbox import cell as cells
from ledger.sandbox.egress import EgressProxy
from ledger.sandbox.quota import Watch
from ledger.sandbox.redaction import Redactor, redactor
from ledger.settings import inherited_environment

#: How much of a command's output is kept as evidence (the end of it).
TAIL_BYTES = 16 * 1024

_prctl: Callable[..., int] | None
try:  # resolved here, in the parent: a forked child must not load libraries
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """``preexec_fn``: on Linux, SIGKILL the child when its parent dies."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

#: What every untrusted command gets from Ledger's environment (plus ``LC_*``).
ALLOWED = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ")
# Refused even when a class or sensor names them: Ledger's own settings (its
# database URLs, API tokens, data dir) and libpq's (PGPASSWORD, PGHOST, ...).
_FORBIDDEN = re.compile(r"^(LEDGER_|PG)|^DATABASE_URL$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The variables naming the command's private temporary directory.
TEMP_VARIABLES = ("TMPDIR", "TMP", "TEMP")

# After the group is killed, how long the pipe may take to reach end-of-file. A
# process that left the group (its own setsid) may hold it open forever.
_DRAIN_S = 2.0


def check_extra(extra: str) -> str:
    """Validate one environment extra: ``NAME`` (passed on from Ledger's
    environment when set there) or ``NAME=VALUE``. ``ValueError`` for a
    malformed or forbidden name."""
    name = extra.partition("=")[0]
    if not _NAME.match(name):
        raise ValueError(f"{extra!r} is not NAME or NAME=VALUE")
    if _FORBIDDEN.search(name):
        raise ValueError(f"{name} is never given to a command Ledger runs "
                         "(LEDGER_*, PG* and DATABASE_URL hold Ledger's secrets)")
    return extra


def cell_environment(extras: Iterable[str] = (), *, base: Mapping[str, str] | None = None
                     ) -> dict[str, str]:
    """The environment of a command in a cell: the locale and time zone of
    ``base`` (default: this process's environment) and ``extras`` (see
    ``check_extra``); the cell sets ``PATH``, ``HOME`` and ``TMPDIR`` to its
    own. Nothing else of Ledger's environment is there."""
    source = inherited_environment() if base is None else base
    env = {k: v for k, v in source.items() if k in ("LANG", "LANGUAGE", "TZ") or k.startswith("LC_")}
    for extra in extras:
        name, sep, value = check_extra(extra).partition("=")
        if sep:
            env[name] = value
        elif name in source:
            env[name] = source[name]
    return env


def child_environment(extras: Iterable[str] = (), *, base: Mapping[str, str] | None = None
                      ) -> dict[str, str]:
    """The environment of an untrusted command: the allow-list from ``base``
    (default: this process's environment) plus ``extras`` (``NAME`` or
    ``NAME=VALUE``, see ``check_extra``). The private temporary directory is
    added by ``run_command``."""
    source = inherited_environment() if base is None else base
    env = {k: v for k, v in source.items() if k in ALLOWED or k.startswith("LC_")}
    for extra in extras:
        name, sep, value = check_extra(extra).partition("=")
        if sep:
            env[name] = value
        elif name in source:
            env[name] = source[name]
    return env


class Tail:
    """The last ``limit`` bytes of a stream, and how long the stream was."""

    def __init__(self, limit: int = TAIL_BYTES):
        self.limit = limit
        self.total = 0
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> None:
        """Append ``chunk``, forgetting whatever falls out of the window."""
        self.total += len(chunk)
        self._buffer += chunk
        if len(self._buffer) > self.limit:
            del self._buffer[: len(self._buffer) - self.limit]

    @property
    def truncated(self) -> bool:
        """Whether the beginning of the stream was dropped."""
        return self.total > len(self._buffer)

    def text(self) -> str:
        """The kept bytes as text (see ``storable``)."""
        return storable(bytes(self._buffer).decode("utf-8", errors="replace"))


def storable(text: str) -> str:
    """Text PostgreSQL can store: NUL is replaced (text and jsonb cannot hold it)."""
    return text.replace("\x00", "\ufffd")


@dataclass(frozen=True)
class CommandResult:
    """How one acceptance command ended."""

    argv: list[str]
    exit_code: int | None  # None: it never started; negative: killed by that signal
    output: str  # the tail of stdout and stderr, interleaved as written
    output_bytes: int
    truncated: bool
    duration_s: float
    timed_out: bool = False
    error: str | None = None  # why it could not start
    extra: dict[str, Any] = field(default_factory=dict)
    #: whether it ran in a cell, and what the cell reported: the processes
    #: still running when the command exited (killed with the cell), and
    #: whether the cell's monitor was killed before it could report
    sandboxed: bool = False
    leftovers: tuple[str, ...] = ()
    monitor_lost: bool = False
    #: with network = "proxy": the destinations its proxy refused
    egress_refused: tuple[str, ...] = ()
    #: in a cell: how it was limited (``mode``: cgroup2, cgroup1 or rlimits;
    #: the limits), what it used, and which limit stopped it (``exceeded``)
    limits: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Exit code 0 within the deadline."""
        return self.exit_code == 0 and not self.timed_out

    def evidence(self) -> dict[str, Any]:
        """The JSON-ready record of this command, as stored with the verdict."""
        record: dict[str, Any] = {
            "argv": self.argv, "exit_code": self.exit_code, "duration_s": round(self.duration_s, 3),
            "timed_out": self.timed_out, "output": self.output, "output_bytes": self.output_bytes,
            "output_truncated": self.truncated,
        }
        if self.error:
            record["error"] = self.error
        record["sandboxed"] = self.sandboxed
        if self.leftovers:
            record["leftovers"] = list(self.leftovers)
        if self.monitor_lost:
            record["monitor_lost"] = True
        if self.egress_refused:
            record["egress_refused"] = list(self.egress_refused)
        if self.limits:
            record["limits"] = dict(self.limits)
        record.update(self.extra)
        return record

    def describe(self) -> str:
        """One line saying how it failed (or that it passed)."""
        shown = " ".join(self.argv)
        if len(shown) > 200:
            shown = shown[:197] + "..."
        if self.timed_out:
            return (f"`{shown}` exceeded the acceptance timeout after {self.duration_s:.1f}s "
                    f"and was killed with its process group")
        if self.error:
            return f"`{shown}` could not start: {self.error}"
        stopped = self.stopped_by()
        if stopped:
            return f"`{shown}` was stopped: {stopped}"
        if self.exit_code is not None and self.exit_code < 0:
            return f"`{shown}` was killed by signal {-self.exit_code}"
        if self.exit_code:
            return f"`{shown}` exited with code {self.exit_code}"
        return f"`{shown}` passed"


    def stopped_by(self) -> str | None:
        """Which limit of its cell stopped the command, in words (``None``: none did)."""
        limits = self.limits
        exceeded = limits.get("exceeded")
        if exceeded == "workspace":
            return (f"it added more than cell.workspace_mb ({limits.get('workspace_mb')} MiB) to its "
                    f"workspace ({limits.get('workspace_peak_mb', 0) - limits.get('workspace_start_mb', 0):.0f} "
                    "MiB by the last count) and its cell was killed")
        if exceeded == "cpu":
            return (f"it used more than cell.cpu_s ({limits.get('cpu_s')} s) of CPU time and its "
                    "cell was killed")
        if limits.get("oom_kills"):
            return (f"its cell ran out of memory (cell.memory_mb = {limits.get('memory_mb')}): "
                    f"{limits['oom_kills']} process(es) killed")
        if self.exit_code in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            return f"a process used more than cell.cpu_s ({limits.get('cpu_s')} s) of CPU time"
        return None


def kill_group(pgid: int) -> None:
    """SIGKILL a process group; a group that is already gone is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Capture(asyncio.SubprocessProtocol):
    """Feeds the output, with Ledger's secrets redacted (``ledger.sandbox.redaction``),
    to a ``Tail`` and tells exit apart from end-of-output.

    ``Process.wait()`` of asyncio's streams API only returns once every pipe
    is closed, so a child that keeps the pipe open would make an exited
    command look like a hung one. The protocol's own callbacks separate them."""

    def __init__(self, tail: Tail, on_output: Callable[[bytes], None] | None,
                 redact: Redactor | None = None):
        self.tail = tail
        self.on_output = on_output
        self.redact = redact if redact is not None else redactor()
        self.exited = asyncio.Event()
        self.closed = asyncio.Event()

    def _deliver(self, data: bytes) -> None:
        if not data:
            return
        self.tail.feed(data)
        if self.on_output is not None:
            self.on_output(data)

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self._deliver(self.redact.feed(data))

    def process_exited(self) -> None:
        self.exited.set()

    def finish(self) -> None:
        """Release what the redactor still holds (the output ended)."""
        self._deliver(self.redact.flush())

    def connection_lost(self, exc: Exception | None) -> None:
        self.finish()
        self.closed.set()


async def run_command(argv: Sequence[str], cwd: Path | str, *, timeout_s: float,
                      env: Mapping[str, str] | None = None,
                      tail_bytes: int = TAIL_BYTES, stdin: bytes | None = None,
                      on_output: Callable[[bytes], None] | None = None,
                      cell: cells.CellSpec | None = None,
                      redact: Redactor | None = None) -> CommandResult:
    """Run ``argv`` in ``cwd`` in its own process group, keep the tail of its
    output (and hand every chunk to ``on_output``), feed it ``stdin``, and kill
    the group at ``timeout_s``, on cancellation, and after it exits
    (stragglers). ``env`` defaults to ``child_environment()``; either way the
    command gets a private temporary directory (``TMPDIR``), removed after it.

    With ``cell``, the command runs in that cell instead (``env`` is ignored:
    the cell's own is whole; ``cwd`` too: the cell says where it starts; the
    private /tmp is the cell's own), and the result says what the cell
    reported. Output reaches ``on_output`` and the tail with Ledger's secrets
    redacted (``redact``, default: this process's known secrets).
    Never raises for the command's own failure."""
    if cell is not None and cell.policy.network == "proxy" and cell.egress is None:
        proxy = EgressProxy(cell.policy.allow)
        async with proxy.serving() as socket_path:
            result = await _run_in_cell(argv, timeout_s=timeout_s, tail_bytes=tail_bytes, stdin=stdin,
                                        on_output=on_output, cell=dataclasses.replace(cell, egress=socket_path),
                                        redact=redact)
        return dataclasses.replace(result, egress_refused=tuple(proxy.refused[:100]))
    if cell is not None:
        return await _run_in_cell(argv, timeout_s=timeout_s, tail_bytes=tail_bytes, stdin=stdin,
                                  on_output=on_output, cell=cell, redact=redact)
    argv = [str(a) for a in argv]
    started = time.monotonic()
    tail = Tail(tail_bytes)
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as scratch:
        environment = dict(env) if env is not None else child_environment()
        environment.update(dict.fromkeys(TEMP_VARIABLES, scratch))
        try:
            transport, capture = await loop.subprocess_exec(
                lambda: _Capture(tail, on_output, redact), *argv, cwd=cwd,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent, env=environment)
        except OSError as exc:
            return CommandResult(argv=argv, exit_code=None, output="", output_bytes=0, truncated=False,
                                 duration_s=time.monotonic() - started,
                                 error=exc.strerror or type(exc).__name__)
        if stdin is not None:
            pipe = transport.get_pipe_transport(0)
            with contextlib.suppress(OSError):  # the command may exit without reading it
                pipe.write(stdin)  # type: ignore[union-attr]
                pipe.close()  # type: ignore[union-attr]
        pid = transport.get_pid()
        timed_out = False
        try:
            try:
                await asyncio.wait_for(capture.exited.wait(), timeout=max(timeout_s, 0.0))
            except TimeoutError:
                timed_out = True
        finally:
            # The session leader's pid is the group id. On timeout or cancellation
            # this kills the command and its children; after a normal exit, the
            # children it left behind.
            kill_group(pid)
            try:
                await asyncio.shield(capture.exited.wait())
                # A process that left the group (its own setsid) may hold the pipe.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(capture.closed.wait()), timeout=_DRAIN_S)
            finally:
                transport.close()
                capture.finish()
        return CommandResult(argv=argv, exit_code=transport.get_returncode(), output=tail.text(),
                             output_bytes=tail.total, truncated=tail.truncated,
                             duration_s=time.monotonic() - started, timed_out=timed_out)


async def _run_in_cell(argv: Sequence[str], *, timeout_s: float, tail_bytes: int,
                       stdin: bytes | None, on_output: Callable[[bytes], None] | None,
                       cell: cells.CellSpec, redact: Redactor | None) -> CommandResult:
    """``run_command`` in a cell: bubblewrap is the process group leader, so
    killing the group kills the cell (its PID namespace dies with its first
    process); the cell's monitor reports the exit status and what was left;
    the cell's cgroup (if any) says what it used, and a watch
    (``ledger.sandbox.quota``) kills it past its workspace or CPU limit."""
    argv = [str(a) for a in argv]
    started = time.monotonic()
    tail = Tail(tail_bytes)
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryFile() as report:
        wrapped = cells.wrap(argv, cell, report.fileno(), extra_preexec=die_with_parent)
        try:
            return await _run_wrapped(argv, wrapped, report, cell, started=started, tail=tail,
                                      timeout_s=timeout_s, stdin=stdin, on_output=on_output,
                                      redact=redact, loop=loop)
        finally:
            await asyncio.shield(asyncio.to_thread(wrapped.close))


async def _run_wrapped(argv: list[str], wrapped: cells.Wrapped, report: Any, cell: cells.CellSpec, *,
                       started: float, tail: Tail, timeout_s: float, stdin: bytes | None,
                       on_output: Callable[[bytes], None] | None, redact: Redactor | None,
                       loop: asyncio.AbstractEventLoop) -> CommandResult:
    policy = cell.policy
    running: dict[str, int] = {}

    def stop_cell() -> None:  # from the watch's thread, at a limit
        if "pid" in running:
            kill_group(running["pid"])
        if wrapped.cgroup is not None:
            wrapped.cgroup.kill()
    watch = await asyncio.to_thread(
        Watch, wrapped.writable, workspace_bytes=policy.workspace_mb << 20, cgroup=wrapped.cgroup,
        cpu_s=float(policy.cpu_s), kill=stop_cell)
    try:
        transport, capture = await loop.subprocess_exec(
            lambda: _Capture(tail, on_output, redact), *wrapped.argv, cwd="/",
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=wrapped.preexec, env=wrapped.env, pass_fds=wrapped.pass_fds)
    except OSError as exc:
        return CommandResult(argv=argv, exit_code=None, output="", output_bytes=0, truncated=False,
                             duration_s=time.monotonic() - started, sandboxed=True,
                             error=exc.strerror or type(exc).__name__, limits=dict(wrapped.limits))
    if stdin is not None:
        pipe = transport.get_pipe_transport(0)
        with contextlib.suppress(OSError):
            pipe.write(stdin)  # type: ignore[union-attr]
            pipe.close()  # type: ignore[union-attr]
    pid = transport.get_pid()
    running["pid"] = pid
    watch.start()
    timed_out = False
    try:
        try:
            await asyncio.wait_for(capture.exited.wait(), timeout=max(timeout_s, 0.0))
        except TimeoutError:
            timed_out = True
    finally:
        kill_group(pid)
        try:
            await asyncio.shield(capture.exited.wait())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(capture.closed.wait()), timeout=_DRAIN_S)
        finally:
            transport.close()
            capture.finish()
            seen = await asyncio.shield(asyncio.to_thread(watch.stop))
    limits = {**wrapped.limits, **seen}
    if wrapped.cgroup is not None:
        limits.update(wrapped.cgroup.usage())
    report.seek(0)
    exit_code, leftovers, reported = _parse_report(report.read(64 * 1024))
    status = transport.get_returncode()
    if not reported:
        # bubblewrap's own status: its failure to build the cell, or the
        # monitor killed (by the command, by the timeout or at a limit)
        exit_code = status
    return CommandResult(argv=argv, exit_code=exit_code, output=tail.text(),
                         output_bytes=tail.total, truncated=tail.truncated,
                         duration_s=time.monotonic() - started, timed_out=timed_out,
                         sandboxed=True, leftovers=leftovers,
                         monitor_lost=not reported and not timed_out and not seen.get("exceeded")
                         and not limits.get("oom_kills"),
                         limits=limits)


def _parse_report(raw: bytes) -> tuple[int | None, tuple[str, ...], bool]:
    """The cell monitor's report: (exit code, processes left, whether it reported)."""
    exit_code: int | None = None
    left: list[str] = []
    for line in raw.splitlines():
        word, _, rest = line.partition(b" ")
        if word == b"exit":
            with contextlib.suppress(ValueError):
                exit_code = int(rest)
        elif word == b"left":
            pid, _, hexed = rest.partition(b" ")
            with contextlib.suppress(ValueError):
                left.append(f"{int(pid)} {bytes.fromhex(hexed.decode()).decode('utf-8', 'replace')}")
    return exit_code, tuple(left), exit_code is not None
