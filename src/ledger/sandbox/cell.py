"""The cell: where every command Ledger does not trust runs (attempt
commands, acceptance commands, sensor checks).

The design at length: docs/internals.md (``ledger.sandbox.cell``).
"""

from __future__ import annotations

import contextlib
import functools
import grp
import os
import pwd
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ledger.errors import ConfigError
from ledger.sandbox import cgroups
from ledger.sandbox.guise import Guise
from ledger.settings import inherited_environment

#: Where things are inside an attempt's cell (the cells that judge have a
#: ``Guise`` instead, and none of these).
INSIDE_ROOT = "/cell"
INSIDE_WORK = "/cell/work"
INSIDE_OUT = "/cell/out"
INSIDE_HOME = "/cell/home"
#: Where the cell's monitor is, inside every cell.
INSIDE_INIT = "/init"
_INIT = Path(__file__).with_name("cell_init.py")
#: The uid and gid an attempt's commands run as (the overflow ids).
CELL_UID = 65534
INSIDE_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
#: What an ordinary machine has at its root (made, empty, in a guised cell).
_ORDINARY_DIRS = ("/home", "/opt", "/srv", "/var", "/run", "/mnt", "/media", "/root")
#: Names that would say whose cell it is: never shown in /etc.
_TELLING = ("ledger",)

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
                                         "reach (e.g. api.example.com:443, *.example.com:443); an "
                                         "IP address only when named exactly")
    memory_mb: int = Field(4096, ge=64, le=1 << 20,
                           description="memory limit: of the whole cell with a cgroup, and of each "
                                       "process's address space")
    processes: int = Field(1024, ge=8, le=1 << 16,
                           description="process (and thread) limit: of the whole cell with a cgroup "
                                       "(root workers too), else per user where the kernel counts them")
    cpu_s: int = Field(3600, ge=1, le=1 << 22,
                       description="CPU seconds a command may use: of the whole cell with a cgroup "
                                   "that counts them, else of each process")
    workspace_mb: int = Field(4096, ge=1, le=1 << 22,
                              description="how much a command may add to its workspace (its writable "
                                          "directories) while it runs; the cell is killed past it")
    file_size_mb: int = Field(4096, ge=1, le=1 << 22,
                              description="largest file a command may write (at most workspace_mb)")
    tmp_mb: int = Field(1024, ge=16, le=1 << 20, description="size of the private /tmp and $HOME")
    read_only: list[str] = Field(default_factory=list,
                                 description="host directories visible read-only at the same path "
                                             "(a toolchain, an agent's installation)")
    writable: list[str] = Field(default_factory=list,
                                description="host directories visible read-write at the same path "
                                            "(a cache shared by every attempt of the class; never a "
                                            "repository, a data dir or anything secret)")

    #: Settings the previous release does not know (and, with ``extra =
    #: forbid``, refuses): left out of a stored spec while they are their
    #: defaults, so its verifiers still read what this release registers.
    NEWER: ClassVar[tuple[str, ...]] = ("cpu_s", "workspace_mb")

    def stored(self) -> dict[str, Any]:
        """The policy as stored in a spec (see ``NEWER``)."""
        dumped = self.model_dump()
        for name in self.NEWER:
            if dumped[name] == type(self).model_fields[name].default:
                del dumped[name]
        return dumped

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
    starts, its whole environment; for a cell that judges, its ``guise``
    (host name, user, home: see ``ledger.sandbox.guise``)."""

    policy: CellPolicy
    bindings: tuple[Binding, ...] = ()
    cwd: str = INSIDE_WORK
    env: Mapping[str, str] = field(default_factory=dict)
    #: the Unix socket of the worker's egress proxy (network = "proxy")
    egress: Path | None = None
    guise: Guise | None = None


@dataclass
class Wrapped:
    """What to execute for a command in its cell, and what to release after
    it (``close``): the cell's own files on the host, its cgroup."""

    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...]
    preexec: Callable[[], None]
    #: the cell's cgroup (``None``: rlimits only), and its mode and limits as recorded
    cgroup: cgroups.CellCgroup | None = None
    limits: dict[str, Any] = field(default_factory=dict)
    #: the host directories the cell can write (its workspace), for the watch
    writable: tuple[Path, ...] = ()
    _scratch: Path | None = None
    _args: Any = None

    def close(self) -> None:
        """Remove the cell's files and its cgroup (what it used is read first: ``usage``)."""
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        if self._args is not None:
            self._args.close()
            self._args = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


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
    argv = [binary, *_namespace_args(CellPolicy(), None), *_system_args(), "--", "/bin/true"]
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


def _namespace_args(policy: CellPolicy, guise: Guise | None) -> list[str]:
    uid = str(guise.uid if guise is not None else CELL_UID)
    gid = str(guise.gid if guise is not None else CELL_UID)
    hostname = guise.hostname if guise is not None else "ledger-cell"
    args = ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", uid, "--gid", gid,
            "--hostname", hostname, "--die-with-parent", "--new-session", "--clearenv"]
    if policy.network == "host":
        args.append("--share-net")
    return args


@functools.lru_cache(maxsize=1)
def _system_args() -> tuple[str, ...]:
    """The host's system as the cell sees it: /usr and the merged-usr links,
    /etc with everything not world-readable, and everything named for
    Ledger, hidden."""
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        path = Path(top)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), top]
        elif path.is_dir():
            args += ["--ro-bind", top, top]
    args += etc_args("/etc", "/etc")
    args += ["--proc", "/proc", "--dev", "/dev"]
    return tuple(args)


def _telling(name: str) -> bool:
    return any(word in name.lower() for word in _TELLING)


def etc_args(source: str, target: str) -> list[str]:
    """``source`` (the host's ``/etc``) seen read-only at ``target``: what a
    local user could not read is hidden (so a cell of a worker running as
    root sees no more than anyone's would), and an entry whose name says
    whose cell it is (``ledger``) is not there at all -- its directory is
    rebuilt without it."""
    args = ["--ro-bind", source, target]
    rebuilt: list[str] = []

    def seen(path: str) -> str:
        return target + path[len(source):]

    for directory, dirs, files in os.walk(source):
        names = sorted(dirs + files)
        if any(_telling(n) for n in names):
            # an empty directory of the cell's own, holding every other entry again
            args += ["--tmpfs", seen(directory)]
            rebuilt.append(seen(directory))
            for name in names:
                full = os.path.join(directory, name)
                if _telling(name):
                    if name in dirs:
                        dirs.remove(name)
                    continue
                try:
                    mode = os.lstat(full).st_mode
                except OSError:
                    continue
                if stat.S_ISLNK(mode):
                    args += ["--symlink", os.readlink(full), seen(full)]
                elif stat.S_ISDIR(mode) or (stat.S_ISREG(mode) and mode & 0o004):
                    args += ["--ro-bind", full, seen(full)]
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
                args += ["--tmpfs", seen(full), "--remount-ro", seen(full)]
        if seen(directory) in rebuilt:
            continue  # unreadable files of a rebuilt directory were simply not bound again
        for name in files:
            full = os.path.join(directory, name)
            try:
                mode = os.lstat(full).st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode) and not mode & 0o004:
                args += ["--ro-bind", os.devnull, seen(full)]
    for directory in reversed(rebuilt):
        args += ["--remount-ro", directory]
    return args


def _base_python() -> str:
    """The interpreter the cell's monitor runs under: the real one behind
    Ledger's (not a virtual environment of Ledger's, which the cell need not
    see); the monitor needs only the standard library."""
    candidate = getattr(sys, "_base_executable", None) or sys.executable
    real = os.path.realpath(candidate)
    return real if os.access(real, os.X_OK) else os.path.realpath(sys.executable)


def _interpreter_paths() -> list[str]:
    """Where the monitor's interpreter lives, when not under /usr (its
    installation prefix, read-only in the cell)."""
    found = []
    python = _base_python()
    for candidate in (sys.base_prefix, os.path.dirname(os.path.dirname(python))):
        real = os.path.realpath(candidate)
        if not real.startswith("/usr/") and real not in ("/", "/usr") and real not in found \
                and python.startswith(real + "/"):
            found.append(real)
    return found


def _venv_of(path: str) -> list[str]:
    """A virtual environment a program lives in (its root, and the prefix of
    the interpreter it is made from): what the program needs to run."""
    bin_dir = os.path.dirname(path)
    root = os.path.dirname(bin_dir)
    config = os.path.join(root, "pyvenv.cfg")
    if not os.path.isfile(config):
        return []
    found = [os.path.realpath(root)]
    try:
        for line in Path(config).read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip().startswith("/"):
                found.append(os.path.realpath(os.path.dirname(value.strip())))
    except OSError:
        pass
    return found


def _named_files(argv: Sequence[str], path: str) -> tuple[list[str], list[str]]:
    """The command's program (found on ``path``) and every existing file its
    command line names by absolute path: visible read-only; and the
    directories of a virtual environment such a program lives in."""
    found: list[str] = []
    environments: list[str] = []
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=path)
    for arg in [program, *argv[1:]]:
        if not arg or not arg.startswith("/") or "\0" in arg:
            continue
        if os.path.isfile(arg):
            found.append(arg)
            real = os.path.realpath(arg)
            if real != arg and os.path.isfile(real):
                found.append(real)
            for directory in _venv_of(arg):
                if directory not in environments:
                    environments.append(directory)
    return found, environments


def _limits(policy: CellPolicy, cgroup: cgroups.CellCgroup | None) -> Callable[[], None]:
    memory = policy.memory_mb << 20
    size = min(policy.file_size_mb, policy.workspace_mb) << 20
    processes = policy.processes
    cpu = policy.cpu_s
    as_root = os.geteuid() == 0
    join = cgroup.joiner() if cgroup is not None else None

    def apply() -> None:
        if join is not None:  # first: everything the cell starts is counted there
            join()
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))  # SIGXCPU, then SIGKILL
        if not as_root:  # root's processes are not counted against it
            resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    return apply


def _host_accounts() -> tuple[list[str], list[str]]:
    """The host's /etc/passwd and /etc/group lines, without any naming Ledger."""
    lines = []
    for name in ("/etc/passwd", "/etc/group"):
        try:
            text = Path(name).read_text()
        except OSError:
            text = ""
        lines.append([line + "\n" for line in text.splitlines() if line and not _telling(line)])
    return lines[0], lines[1]


def _guise_files(guise: Guise, scratch: Path) -> list[str]:
    """The cell's /etc files that say who and where it is, written for its
    guise (only over files the host has: a read-only /etc takes no new ones)."""
    passwd, group = _host_accounts()
    files = {"passwd": "".join(passwd) + guise.passwd_line(), "group": "".join(group) + guise.group_line(),
             "hostname": guise.hostname + "\n", "hosts": guise.hosts(), "machine-id": guise.machine_id + "\n"}
    args: list[str] = []
    for name, text in files.items():
        if not os.path.exists(f"/etc/{name}"):
            continue
        (scratch / name).write_text(text)
        args += ["--ro-bind", str(scratch / name), f"/etc/{name}"]
    boot = scratch / "boot_id"
    machine = guise.machine_id
    boot.write_text(f"{machine[:8]}-{machine[8:12]}-{machine[12:16]}-{machine[16:20]}-{machine[20:32]}\n")
    args += ["--ro-bind", str(boot), "/proc/sys/kernel/random/boot_id"]
    return args


def _taken() -> tuple[frozenset[int], frozenset[str]]:
    """The host's uids and user names (a guise's user is a new one)."""
    with contextlib.suppress(Exception):
        users = pwd.getpwall()
        return (frozenset(u.pw_uid for u in users) | frozenset(g.gr_gid for g in grp.getgrall()),
                frozenset(u.pw_name for u in users))
    return frozenset(), frozenset()


def taken_accounts() -> tuple[frozenset[int], frozenset[str]]:
    """What a guise must avoid on this host (see ``ledger.sandbox.guise.draw``)."""
    return _taken()


def wrap(argv: Sequence[str], spec: CellSpec, report_fd: int,
         extra_preexec: Callable[[], None] | None = None) -> Wrapped:
    """The bubblewrap command line that runs ``argv`` in the cell ``spec``
    describes, with the cell's first process reporting to ``report_fd``.
    The caller runs it and then calls ``close`` on the result."""
    binary = bubblewrap()
    if binary is None:
        raise SandboxUnavailable("commands cannot be sandboxed: bubblewrap (bwrap) is not installed",
                                 hint="apt-get install bubblewrap")
    policy = spec.policy
    guise = spec.guise
    home = guise.home if guise is not None else INSIDE_HOME
    env = {"PATH": INSIDE_PATH, "HOME": home, "TMPDIR": "/tmp", "USER": "cell",
           "LOGNAME": "cell", "SHELL": "/bin/sh", **(guise.environment() if guise else {}), **spec.env}
    # The cell's own files on the host (its monitor, its /etc files), under a
    # name that says nothing (a bind mount's source shows in its mountinfo).
    scratch = Path(tempfile.mkdtemp())
    try:
        cgroup, found = cgroups.for_cell(policy.memory_mb << 20, policy.processes)
        limits: dict[str, Any] = {"mode": found.mode, "memory_mb": policy.memory_mb,
                                  "processes": policy.processes, "cpu_s": policy.cpu_s,
                                  "workspace_mb": policy.workspace_mb}
        if found.reason and cgroup is None:
            limits["mode_reason"] = found.reason[:500]
        args = _cell_args(argv, spec, env, scratch, home)
        shutil.copyfile(_INIT, scratch / "init")
        monitor = [str(report_fd)]
        if spec.egress is not None:
            from ledger.sandbox.egress import INSIDE_SOCKET
            monitor += ["--egress", INSIDE_SOCKET]
        args += ["--chdir", spec.cwd]
        command = ["--", _base_python(), "-I", "-S", "-B", INSIDE_INIT, *monitor, "--", *argv]
        listing = tempfile.TemporaryFile()
        listing.write(b"".join(a.encode("utf-8", "surrogateescape") + b"\0" for a in args))
        listing.flush()
        listing.seek(0)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    apply_limits = _limits(policy, cgroup)

    def preexec() -> None:
        apply_limits()
        if extra_preexec is not None:
            extra_preexec()
    writable = tuple(b.source for b in spec.bindings if b.writable)
    # (bubblewrap takes the command itself on its command line, not from --args)
    return Wrapped(argv=[binary, "--args", str(listing.fileno()), *command], env={},
                   pass_fds=(report_fd, listing.fileno()), preexec=preexec, cgroup=cgroup,
                   limits=limits, writable=writable, _scratch=scratch, _args=listing)


def _cell_args(argv: Sequence[str], spec: CellSpec, env: dict[str, str], scratch: Path,
               home: str) -> list[str]:
    """Everything bubblewrap is told, but the command and where it starts."""
    policy = spec.policy
    guise = spec.guise
    args: list[str] = [*_namespace_args(policy, guise), *_system_args()]
    tmp_bytes = str(policy.tmp_mb << 20)
    args += ["--size", tmp_bytes, "--tmpfs", "/tmp"]
    if guise is None:
        args += ["--dir", INSIDE_ROOT]
    else:
        for directory in _ORDINARY_DIRS:
            if not home.startswith(directory + "/") and directory != home:
                args += ["--dir", directory]
        args += _guise_files(guise, scratch)
    args += ["--size", tmp_bytes, "--tmpfs", home]
    visible: list[str] = []
    named, environments = _named_files(argv, env["PATH"] + ":" + inherited_environment().get("PATH", ""))
    for directory in [*_interpreter_paths(), *environments, *policy.read_only]:
        if os.path.isdir(directory) and directory not in visible:
            visible.append(directory)
            args += ["--ro-bind", directory, directory]
    for directory in policy.writable:
        if os.path.isdir(directory):
            visible.append(directory)
            args += ["--bind", directory, directory]
    for file in named:
        if not any(file == d or file.startswith(d.rstrip("/") + "/") for d in visible):
            if not file.startswith("/usr/"):
                args += ["--ro-bind", file, file]
    for binding in spec.bindings:
        args += ["--bind" if binding.writable else "--ro-bind", str(binding.source), binding.target]
    args += ["--ro-bind", str(scratch / "init"), INSIDE_INIT]
    if spec.egress is not None:
        from ledger.sandbox.egress import INSIDE_SOCKET, proxy_environment
        args += ["--bind", str(spec.egress), INSIDE_SOCKET]
        env.update(proxy_environment())
    # Nothing but the mounts above is writable: the cell's own root (a
    # tmpfs of bubblewrap's, as large as the host's memory allows) is not.
    args += ["--remount-ro", "/"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args
