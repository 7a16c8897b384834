"""The cell: where every command Ledger does not trust runs (attempt
commands, acceptance commands, sensor checks).

A cell is a bubblewrap sandbox (Debian's ``bubblewrap``; the kernel's
namespaces through a small, audited setuid-free tool, rather than isolation
written here), built fresh for each command:

* **Its own PID namespace.** No process of Ledger's -- nor any other process
  of the host -- is visible in its ``/proc``, so the worker's environment
  (its database URL, its tokens) cannot be read from
  ``/proc/<pid>/environ``; bubblewrap itself is started with an empty
  environment for the same reason (its PID 1 is readable from inside). Every
  process of the command dies with the cell: a double-forked ``setsid``
  daemon included. The cell's first process (``ledger/cell_init.py``) lists
  what was still running when the command exited, and that list is reported.
* **Its own mount namespace**, on an empty root: the host's ``/usr`` and
  ``/etc`` read-only -- in ``/etc`` only what any local user may read, the
  rest hidden -- the interpreter Ledger runs under and the directories a
  class lists (``cell.read_only``) read-only, the command's own program and
  any file its command line names read-only, a private ``/tmp`` and
  ``$HOME`` (tmpfs), and its workspace, the only host directory it can
  write. Ledger's data directory, configuration, evidence, other attempts,
  the user's repository and ``$HOME`` are simply not there.
* **Its own network namespace**: by default no network at all (only its own
  loopback, where nothing of the host listens). ``network = "proxy"`` keeps
  that, plus one way out: an HTTPS ``CONNECT`` proxy of the worker's that
  lets through only the ``host:port`` patterns of ``cell.allow``, never to an
  address of the host's own networks (``ledger.sandbox.egress``); what it refuses is
  reported. ``network = "host"`` shares the host's network (everything the
  host reaches, the database included: a last resort, logged).
* **Its own user namespace** (uid 65534 inside, no capabilities, no further
  user namespaces), IPC, UTS and cgroup namespaces, a new session (no
  terminal injection), and ``--die-with-parent``.
* **Limits**: memory (address space), file size, open files and no core
  dumps by ``setrlimit``; processes too, by ``setrlimit`` where the kernel
  counts them (a worker that is not root). Time: the caller's timeout kills
  the cell.

A host without bubblewrap, or whose kernel refuses unprivileged namespaces,
cannot start a service that needs cells (``SandboxUnavailable``, naming the
package): it waits, not ready, until one can be built
(``ledger.runtime.startup``). Running
without the cell is a per-class, explicit opt-out (``cell.sandbox = false``),
logged at every start and journaled with every attempt.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ledger.errors import ConfigError
from ledger.settings import inherited_environment

#: Where things are inside a cell.
INSIDE_ROOT = "/cell"
INSIDE_WORK = "/cell/work"
INSIDE_OUT = "/cell/out"
INSIDE_HOME = "/cell/home"
_INSIDE_INIT = "/cell/.init/init.py"
_INIT = Path(__file__).with_name("cell_init.py")
#: The uid and gid commands run as inside the cell (the overflow ids).
CELL_UID = 65534
INSIDE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"

Network = Literal["none", "proxy", "host"]


class SandboxUnavailable(ConfigError):
    """The host cannot build cells (bubblewrap missing, or namespaces refused)."""

    slug = "sandbox-unavailable"


class CellPolicy(BaseModel):
    """What a class's (or a sensor's) commands may use: ``[classes.X.cell]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sandbox: bool = Field(True, description="run commands in a cell; false is an explicit, logged "
                                            "opt-out (the command then runs as the worker's user)")
    network: Network = Field("none", description="none: no network; proxy: only the hosts of "
                                                 "cell.allow, through the worker's proxy; host: the "
                                                 "host's network (everything it reaches, the "
                                                 "database included)")
    allow: list[str] = Field(default_factory=list,
                             description="with network = proxy: the HOST:PORT patterns a command may "
                                         "reach (e.g. api.example.com:443, *.example.com:443)")
    memory_mb: int = Field(4096, ge=64, le=1 << 20, description="address-space limit per process")
    processes: int = Field(1024, ge=8, le=1 << 16,
                           description="process limit (where the kernel counts them)")
    file_size_mb: int = Field(4096, ge=1, le=1 << 22, description="largest file a command may write")
    tmp_mb: int = Field(1024, ge=16, le=1 << 20, description="size of the private /tmp and $HOME")
    read_only: list[str] = Field(default_factory=list,
                                 description="host directories visible read-only at the same path "
                                             "(a toolchain, an agent's installation)")
    writable: list[str] = Field(default_factory=list,
                                description="host directories visible read-write at the same path "
                                            "(a cache shared by every attempt of the class; never a "
                                            "repository, a data dir or anything secret)")

    @field_validator("read_only", "writable")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.startswith("/") or "\0" in path:
                raise ValueError(f"cell.read_only entries are absolute paths, not {path!r}")
        return value

    @field_validator("allow")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        from ledger.sandbox.egress import check_pattern
        for pattern in value:
            check_pattern(pattern)
        return value

    @model_validator(mode="after")
    def _allow_needs_proxy(self) -> CellPolicy:
        if self.network == "proxy" and not self.allow:
            raise ValueError("cell.network = proxy needs cell.allow (the HOST:PORT patterns it may reach)")
        if self.allow and self.network != "proxy":
            raise ValueError("cell.allow applies with cell.network = proxy only")
        return self


@dataclass(frozen=True)
class Binding:
    """A host path made visible in the cell at ``target``."""

    source: Path
    target: str
    writable: bool = False


@dataclass(frozen=True)
class CellSpec:
    """One command's cell: its policy, what of the host it sees, where it
    starts, its whole environment."""

    policy: CellPolicy
    bindings: tuple[Binding, ...] = ()
    cwd: str = INSIDE_WORK
    env: Mapping[str, str] = field(default_factory=dict)
    #: the Unix socket of the worker's egress proxy (network = "proxy")
    egress: Path | None = None


@dataclass(frozen=True)
class Wrapped:
    """What to execute for a command in its cell."""

    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...]
    preexec: Callable[[], None]


def bubblewrap() -> str | None:
    """The bubblewrap binary, if installed."""
    return shutil.which("bwrap") or (shutil.which("bwrap", path="/usr/bin:/usr/local/bin"))


_checked: dict[str, str | None] = {}
_check_lock = threading.Lock()


def check_available() -> None:
    """``SandboxUnavailable`` unless a cell can be built on this host (a
    throwaway cell running ``true``). Success is kept for the process; a
    failure is probed again next time -- bubblewrap installed meanwhile, or a
    kernel setting changed, ends a service's wait to start."""
    with _check_lock:
        if _checked.get("result", "unknown") is not None:
            _checked["result"] = _probe()
    problem = _checked["result"]
    if problem is not None:
        raise SandboxUnavailable(problem, hint="install Debian's bubblewrap (apt-get install "
                                               "bubblewrap), or opt a class out with cell.sandbox = false")


def _probe() -> str | None:
    binary = bubblewrap()
    if binary is None:
        return "commands cannot be sandboxed: bubblewrap (bwrap) is not installed"
    argv = [binary, *_namespace_args(CellPolicy()), *_system_args(), "--", "/bin/true"]
    try:
        done = subprocess.run(argv, env={}, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"commands cannot be sandboxed: bubblewrap did not run ({exc})"
    if done.returncode != 0:
        complaint = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return ("commands cannot be sandboxed: bubblewrap could not build a cell"
                + (f" ({complaint[-1]})" if complaint else "")
                + "; the kernel must allow unprivileged user namespaces")
    return None


def _namespace_args(policy: CellPolicy) -> list[str]:
    args = ["--unshare-all", "--unshare-user", "--disable-userns",
            "--uid", str(CELL_UID), "--gid", str(CELL_UID),
            "--hostname", "ledger-cell", "--die-with-parent", "--new-session", "--clearenv"]
    if policy.network == "host":
        args.append("--share-net")
    return args


@functools.lru_cache(maxsize=1)
def _system_args() -> tuple[str, ...]:
    """The host's system as the cell sees it: /usr and the merged-usr links,
    /etc with everything not world-readable hidden."""
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    args += ["--ro-bind", "/etc", "/etc", *_hidden("/etc")]
    args += ["--proc", "/proc", "--dev", "/dev"]
    return tuple(args)


def _hidden(root: str) -> list[str]:
    """Mounts that hide what under ``root`` a local user could not read (so a
    cell of a worker running as root sees no more than anyone's would)."""
    args: list[str] = []
    for directory, dirs, files in os.walk(root):
        for name in list(dirs):
            full = os.path.join(directory, name)
            try:
                mode = os.lstat(full).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                dirs.remove(name)
            elif mode & 0o005 != 0o005:  # not listable by others: hide it whole
                dirs.remove(name)
                args += ["--tmpfs", full, "--remount-ro", full]
        for name in files:
            full = os.path.join(directory, name)
            try:
                mode = os.lstat(full).st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode) and not mode & 0o004:
                args += ["--ro-bind", os.devnull, full]
    return args


def _interpreter_paths() -> list[str]:
    """Where the Python Ledger runs under lives (its prefix, the base prefix of
    a venv, the real directory of the executable) when not under /usr."""
    found = []
    for candidate in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(
            os.path.realpath(sys.executable)))):
        real = os.path.realpath(candidate)
        if not real.startswith("/usr/") and real not in found:
            found.append(real)
    return found


def _named_files(argv: Sequence[str], path: str) -> list[str]:
    """The command's program (found on ``path``) and every existing file its
    command line names by absolute path: visible read-only."""
    found: list[str] = []
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=path)
    for arg in [program, *argv[1:]]:
        if not arg or not arg.startswith("/") or "\0" in arg:
            continue
        if os.path.isfile(arg):
            found.append(arg)
            real = os.path.realpath(arg)
            if real != arg and os.path.isfile(real):
                found.append(real)
    return found


def _limits(policy: CellPolicy) -> Callable[[], None]:
    memory = policy.memory_mb << 20
    size = policy.file_size_mb << 20
    processes = policy.processes
    as_root = os.geteuid() == 0

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
        if not as_root:  # root's processes are not counted against it
            resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    return apply


def wrap(argv: Sequence[str], spec: CellSpec, report_fd: int,
         extra_preexec: Callable[[], None] | None = None) -> Wrapped:
    """The bubblewrap command line that runs ``argv`` in the cell ``spec``
    describes, with the cell's first process reporting to ``report_fd``."""
    binary = bubblewrap()
    if binary is None:
        raise SandboxUnavailable("commands cannot be sandboxed: bubblewrap (bwrap) is not installed",
                                 hint="apt-get install bubblewrap")
    policy = spec.policy
    env = {"PATH": INSIDE_PATH, "HOME": INSIDE_HOME, "TMPDIR": "/tmp", "USER": "cell",
           "LOGNAME": "cell", "SHELL": "/bin/sh", **spec.env}
    args: list[str] = [binary, *_namespace_args(policy), *_system_args()]
    tmp_bytes = str(policy.tmp_mb << 20)
    args += ["--size", tmp_bytes, "--tmpfs", "/tmp", "--dir", INSIDE_ROOT,
             "--size", tmp_bytes, "--tmpfs", INSIDE_HOME]
    visible: list[str] = []
    for directory in [*_interpreter_paths(), *policy.read_only]:
        if os.path.isdir(directory) and directory not in visible:
            visible.append(directory)
            args += ["--ro-bind", directory, directory]
    for directory in policy.writable:
        if os.path.isdir(directory):
            visible.append(directory)
            args += ["--bind", directory, directory]
    for file in _named_files(argv, env["PATH"] + ":" + inherited_environment().get("PATH", "")):
        if not any(file == d or file.startswith(d.rstrip("/") + "/") for d in visible):
            if not file.startswith("/usr/"):
                args += ["--ro-bind", file, file]
    if policy.network == "host" and os.path.exists("/etc/resolv.conf"):
        pass  # /etc is already there (resolv.conf included)
    for binding in spec.bindings:
        args += ["--bind" if binding.writable else "--ro-bind", str(binding.source), binding.target]
    args += ["--ro-bind", str(_INIT), _INSIDE_INIT]
    monitor = [str(report_fd)]
    if spec.egress is not None:
        from ledger.sandbox.egress import INSIDE_SOCKET, proxy_environment
        args += ["--bind", str(spec.egress), INSIDE_SOCKET]
        monitor += ["--egress", INSIDE_SOCKET]
        env.update(proxy_environment())
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += ["--chdir", spec.cwd, "--",
             sys.executable, "-I", "-S", "-B", _INSIDE_INIT, *monitor, "--", *argv]
    apply_limits = _limits(policy)

    def preexec() -> None:
        apply_limits()
        if extra_preexec is not None:
            extra_preexec()
    return Wrapped(argv=args, env={}, pass_fds=(report_fd,), preexec=preexec)


def inside_path(host: Path, bindings: Iterable[Binding]) -> str | None:
    """Where the host path ``host`` is seen inside a cell with ``bindings``."""
    for binding in bindings:
        try:
            rest = host.relative_to(binding.source)
        except ValueError:
            continue
        return binding.target if str(rest) == "." else f"{binding.target}/{rest}"
    return None


def timed_probe(runs: int = 5) -> tuple[float, float]:
    """The start-up cost of a cell: median seconds of ``true`` in a cell and
    outside one (the figure docs/figures.md states)."""
    import statistics
    import tempfile
    inside, outside = [], []
    for _ in range(runs):
        with tempfile.TemporaryFile() as report:
            wrapped = wrap(["/bin/true"], CellSpec(CellPolicy(), cwd="/"), report.fileno())
            t0 = time.perf_counter()
            subprocess.run(wrapped.argv, env=wrapped.env, pass_fds=wrapped.pass_fds,
                           preexec_fn=wrapped.preexec, check=True)
            inside.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run(["/bin/true"], check=True)
        outside.append(time.perf_counter() - t0)
    return statistics.median(inside), statistics.median(outside)
