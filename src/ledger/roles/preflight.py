"""Configuration checked up front: by ``ledger classes sync`` and at the
start of every command that reads ``ledger.toml`` (``worker``, ``sensor run``,
``run``), before anything is opened, claimed or charged.

What the file alone says (unknown placeholders, a sensor target outside its
class, bad values) is refused while parsing it (``ledger.config``). What
takes a look at the repositories is checked here, and told apart:

* **misconfigured** -- the repository does not exist or is not a git
  repository, the remote refuses Ledger's credentials, the class's
  ``base_ref`` (or the ref a sensor observes) is not there: nothing would
  ever work, so the command refuses to start with one line naming the key
  (``ConfigError``, exit 78);
* **unreachable right now** -- connection refused, a timeout, a name that
  does not resolve, a server error: the command warns (one line naming the
  key) and starts anyway; the work waits on the remote as on any other
  system fault, charged nothing.

A remote is asked with ``git ls-remote`` (Ledger's hardened git, the
operator's credentials); a local path is read directly.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ledger.config import LedgerConfig
from ledger.errors import ConfigError
from ledger.git import hardened_git
from ledger.git.repository import _is_local, _upload_pack
from ledger.roles.sensors import observed_ref

#: How long one repository may take to answer before it counts as unreachable.
TIMEOUT_S = 15.0

Kind = Literal["misconfigured", "unreachable"]

# What git says when the remote cannot be reached right now (as opposed to a
# remote that answered "no"): refused or reset connections, timeouts, names
# that do not resolve, a server failing. Anything else git refuses with is a
# misconfiguration.
_UNREACHABLE = re.compile(
    r"connection refused|connection timed out|timed out|could not resolve|name or service not known|"
    r"temporary failure in name resolution|network is unreachable|no route to host|unable to connect|"
    r"failed to connect|connection reset|connection closed|early eof|unexpected disconnect|"
    r"returned error: 5\d\d|ssl|gnutls|the remote end hung up unexpectedly", re.I)
# ... unless the remote did answer, with a refusal.
_REFUSED = re.compile(
    r"not found|no such repository|does not appear to be a git repository|not exported|"
    r"authentication failed|could not read (username|password)|access denied|permission denied|"
    r"returned error: 40[134]", re.I)
_CREDENTIALS = re.compile(r"could not read (username|password)|authentication failed|"
                          r"returned error: 40[13]|permission denied \(publickey", re.I)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the configuration: where (``key``), what, and
    whether it is a misconfiguration (refuse) or a remote out of reach now
    (warn)."""

    key: str
    kind: Kind
    message: str

    def line(self) -> str:
        """The one line an operator reads."""
        tail = ("" if self.kind == "misconfigured"
                else "; starting anyway: the work waits until it can be reached")
        return f"{self.key}: {self.message}{tail}"


def _full(ref: str) -> str:
    return ref if ref.startswith("refs/") else f"refs/heads/{ref}"


def _is_sha(text: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", text) is not None


@dataclass(frozen=True)
class Probe:
    """What asking a repository found: a problem of the repository itself
    (``None``: it answered), and the refs (or commits) it does not have."""

    problem: tuple[Kind, str] | None = None
    missing: tuple[str, ...] = ()


def probe(location: str, refs: Sequence[str], *, timeout_s: float = TIMEOUT_S) -> Probe:
    """Whether ``location`` can serve ``refs`` (names or SHAs) now."""
    if _is_local(location) and not location.startswith("file://"):
        path = Path(location).expanduser()
        if not path.exists():
            return Probe(("misconfigured", f"{location} does not exist"))
    wanted = [r for r in refs if not _is_sha(r)]
    with tempfile.TemporaryDirectory(prefix="ledger-preflight-") as scratch:
        try:
            done = hardened_git.run(scratch, ["ls-remote", *_upload_pack(location), "--", location,
                                              *(_full(r) for r in wanted)],
                                    repo=None, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return Probe(("unreachable", f"{location} did not answer within {timeout_s:g}s"))
        except OSError as exc:
            return Probe(("unreachable", f"cannot run git: {exc.strerror or exc}"))
    if done.returncode != 0:
        text = done.stderr.decode("utf-8", errors="replace").strip()
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        said = lines[-1].removeprefix("fatal: ") if lines else f"git ls-remote exited with {done.returncode}"
        if _UNREACHABLE.search(text) and not _REFUSED.search(text):
            return Probe(("unreachable", f"cannot reach {location}: {said}"))
        if _CREDENTIALS.search(text):
            said += (" (the remote's credentials reach Ledger's git through "
                     "LEDGER_GIT_CREDENTIAL_HELPER, LEDGER_GIT_CONFIG or GIT_ASKPASS)")
        return Probe(("misconfigured", f"{location} is not a repository Ledger can use: {said}"))
    listed = {line.split("\t", 1)[1] for line in done.stdout.decode().splitlines() if "\t" in line}
    missing = [r for r in wanted if _full(r) not in listed]
    root = location[len("file://"):] if location.startswith("file://") else location
    for sha in (r for r in refs if _is_sha(r)):
        if _is_local(location) and hardened_git.run(
                root, ["cat-file", "-e", f"{sha}^{{commit}}"], timeout=timeout_s).returncode != 0:
            missing.append(sha)
    return Probe(None, tuple(missing))


def check(config: LedgerConfig, *, classes: Iterable[str] | None = None,
          sensors: Iterable[str] | None = None, timeout_s: float = TIMEOUT_S) -> list[Problem]:
    """Every problem of the chosen classes' repositories (default: all) and
    of the refs the chosen sensors observe (default: all; ``()``: none).
    Each repository is asked once."""
    chosen = sorted(config.classes) if classes is None else list(classes)
    watching = sorted(config.sensors) if sensors is None else list(sensors)
    wanted: dict[str, dict[str, str]] = {}  # location -> ref -> the key that names it
    owners: dict[str, str] = {}  # location -> the key that names it
    for name in chosen:
        cls = config.campaign_class(name)
        owners.setdefault(cls.repository, f"classes.{name}.repository")
        wanted.setdefault(cls.repository, {}).setdefault(cls.base_ref, f"classes.{name}.base_ref")
    for name in watching:
        sensor = config.sensors[name]
        observes = observed_ref(sensor, config.classes.get(sensor.campaign_class))
        if observes is not None:
            repository, ref = observes
            owners.setdefault(repository, f"sensors.{name}.target")
            wanted.setdefault(repository, {}).setdefault(ref, f"sensors.{name}.target")
    problems: list[Problem] = []
    for location, refs in wanted.items():
        found = probe(location, list(refs), timeout_s=timeout_s)
        if found.problem is not None:
            problems.append(Problem(owners[location], *found.problem))
        for ref in found.missing:
            problems.append(Problem(refs[ref], "misconfigured", f"{location} has no {ref}"))
    return problems


def enforce(problems: Sequence[Problem], source: str, warn: Callable[[str], object], *,
            refused: str = "nothing was done") -> None:
    """Warn (``warn(line)``) about each repository out of reach now; then
    ``ConfigError`` naming the first misconfigured key (and how many more
    there are), ending with ``refused`` (what was not done)."""
    wrong = [p for p in problems if p.kind == "misconfigured"]
    for problem in problems:
        if problem.kind == "unreachable":
            warn(f"warning: {source}: {problem.line()}")
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise ConfigError(f"{source}: {wrong[0].line()}{more}; {refused}")
