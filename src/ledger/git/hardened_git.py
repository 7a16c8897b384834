"""How Ledger runs git: never code that a repository, a user or the system
configured.

The design at length: docs/internals.md (``ledger.git.hardened_git``).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from ledger import settings
from ledger.settings import inherited_environment

#: Always overridden, whatever any configuration says (key, value). An empty
#: value turns a program off; for ``credential.helper`` it also clears the
#: helpers configured before it (the operator's are added back after it).
STATIC_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("core.askPass", ""),
    ("core.pager", "cat"),
    ("core.editor", "false"),
    ("sequence.editor", "false"),
    ("core.gitProxy", ""),
    ("core.alternateRefsCommand", ""),
    ("diff.external", ""),
    ("credential.helper", ""),
    # Only git's own transports: no ext:: (a command line), fd:: or remote helpers.
    ("protocol.allow", "never"),
    ("protocol.file.allow", "always"),
    ("protocol.git.allow", "always"),
    ("protocol.ssh.allow", "always"),
    ("protocol.http.allow", "always"),
    ("protocol.https.allow", "always"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("push.gpgSign", "false"),
    ("gpg.program", "false"),
    ("init.templateDir", ""),
)

# Keys that name a program (or pull in more configuration), wherever they are
# defined: blanked when a repository's own configuration has them.
_PROGRAM_KEYS = re.compile(
    r"""^(?:
        core\.(?:fsmonitor|hookspath|sshcommand|askpass|editor|pager|gitproxy|alternaterefscommand)
      | credential\..*helper
      | diff\.external | diff\..+\.(?:command|textconv)
      | filter\..+\.(?:clean|smudge|process)
      | merge\..+\.driver
      | gpg\.(?:program|.+\.program|ssh\.defaultkeycommand)
      | sequence\.editor | pager\..+
      | remote\..+\.(?:uploadpack|receivepack|vcs)
      | hook\..+\.command
    )$""", re.X | re.I)
# (uploadpack.packObjectsHook is not among them: git honours it only from the
# command line, system and user configuration -- none of which is the
# repository's -- and an override would set it, not clear it.)


def _neutral(name: str) -> str:
    """The value that turns a program-valued key off (an empty command is not
    always "none": git would try to run it, or, for a merge driver, take the
    empty command's success as a clean merge)."""
    lower = name.lower()
    if lower.endswith(".textconv"):
        return "cat"  # Ledger diffs with --no-textconv; were one applied, it is the identity
    if lower.startswith("merge.") and lower.endswith(".driver"):
        return "false"  # a conflict, never a silent "ours"
    if lower.endswith(".uploadpack"):
        return "git-upload-pack"
    if lower.endswith(".receivepack"):
        return "git-receive-pack"
    if lower in ("core.fsmonitor", "gpg.program") or lower.endswith(".program") or lower.startswith("pager."):
        return "false"
    if lower == "core.pager":
        return "cat"
    if lower.endswith("editor"):
        return "false"
    if lower == "core.hookspath":
        return os.devnull
    if lower == "core.sshcommand":
        return "ssh"
    return ""

#: Git's own transport settings that Ledger's trusted git may use from its
#: environment: what reaching a remote takes (an ssh agent, an askpass
#: program, proxies, certificates), never anything that redirects git to
#: another repository.
TRANSPORT_VARIABLES = (
    "SSH_AUTH_SOCK", "SSH_AGENT_PID", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_ASKPASS", "SSH_ASKPASS",
    "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "GIT_SSL_CAINFO", "GIT_SSL_NO_VERIFY", "SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_CA_BUNDLE",
)
#: Of the ordinary environment, what git and ssh need.
_BASE_VARIABLES = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "USER", "LOGNAME")

_cache: dict[str, tuple[tuple[int, int], tuple[tuple[str, str], ...]]] = {}
_lock = threading.Lock()


def operator_config() -> str:
    """The git configuration file Ledger's trusted git reads instead of the
    user's: ``LEDGER_GIT_CONFIG`` (credentials, transport settings), else
    nothing (``/dev/null``)."""
    return settings.environment("git_config") or os.devnull


def _credential_helpers() -> list[str]:
    # The operator's helpers, added back after the reset: LEDGER_GIT_CREDENTIAL_HELPER
    # (one helper as git writes it, e.g. "store --file=/etc/ledger/git-credentials").
    helper = settings.environment("git_credential_helper")
    return [helper] if helper else []


def base_environment() -> dict[str, str]:
    """The environment every trusted git call starts from: the ordinary
    variables, the transport settings, no prompts, no system or user
    configuration."""
    env = {k: v for k, v in inherited_environment().items()
           if k in _BASE_VARIABLES or k in TRANSPORT_VARIABLES or k.startswith("LC_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=operator_config(), GIT_ATTR_NOSYSTEM="1",
               GIT_TERMINAL_PROMPT="0", GIT_OPTIONAL_LOCKS="0", GIT_NO_REPLACE_OBJECTS="1")
    return env


def overrides(repo: str | Path | None) -> list[tuple[str, str]]:
    """Every override for a git call in ``repo`` (``None``: outside any
    repository, e.g. ``clone``): the static set, the operator's credential
    helpers, and a blank for each program-valued key the repository's own
    configuration defines."""
    found: list[tuple[str, str]] = list(STATIC_OVERRIDES)
    found += [("credential.helper", helper) for helper in _credential_helpers()]
    if not any(k in inherited_environment() for k in ("GIT_SSH_COMMAND", "GIT_SSH")):
        found.append(("core.sshCommand", "ssh"))
    if repo is not None:
        found += _repository_overrides(Path(repo))
    return found


def environment(repo: str | Path | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of a trusted git call in ``repo``."""
    env = base_environment()
    pairs = overrides(repo)
    env["GIT_CONFIG_COUNT"] = str(len(pairs))
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    for key, value in (extra or {}).items():
        if key.startswith("GIT_CONFIG") or key in ("GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR"):
            raise ValueError(f"{key} is set by Ledger's hardened git, not by a caller")
        env[key] = value
    return env


def _config_file(repo: Path) -> Path | None:
    for candidate in (repo / ".git" / "config", repo / "config"):
        if candidate.is_file():
            return candidate
    git_file = repo / ".git"
    if git_file.is_file():  # a linked worktree: gitdir: <path>
        text = git_file.read_text(errors="replace").strip()
        if text.startswith("gitdir:"):
            gitdir = Path(text[len("gitdir:"):].strip())
            gitdir = gitdir if gitdir.is_absolute() else (repo / gitdir)
            common = gitdir / "commondir"
            if common.is_file():
                root = Path(common.read_text().strip())
                root = root if root.is_absolute() else gitdir / root
                if (root / "config").is_file():
                    return root / "config"
            if (gitdir / "config").is_file():
                return gitdir / "config"
    return None


def _repository_overrides(repo: Path) -> list[tuple[str, str]]:
    config = _config_file(repo)
    if config is None:
        return []
    try:
        stat = config.stat()
    except OSError:
        return []
    stamp = (stat.st_mtime_ns, stat.st_size)
    key = str(config)
    with _lock:
        cached = _cache.get(key)
    if cached is not None and cached[0] == stamp:
        return list(cached[1])
    found = tuple(_listed_overrides(repo))
    with _lock:
        _cache[key] = (stamp, found)
    return list(found)


def _listed_overrides(repo: Path) -> list[tuple[str, str]]:
    """Blank every program-valued key the repository's configuration (and
    whatever it includes) defines. Listing configuration runs no program."""
    env = base_environment()
    env["GIT_CONFIG_COUNT"] = "0"
    try:
        done = subprocess.run(["git", "config", "--list", "--includes", "-z"], cwd=repo, env=env,
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    result: list[tuple[str, str]] = []
    seen: set[str] = set()
    for entry in done.stdout.split(b"\0"):
        if not entry:
            continue
        name = entry.split(b"\n", 1)[0].decode("utf-8", errors="replace")
        if name.lower() in seen or not _PROGRAM_KEYS.match(name):
            continue
        seen.add(name.lower())
        result.append((name, _neutral(name)))
        if name.lower().startswith("filter."):
            driver = name.rsplit(".", 1)[0]
            if f"{driver}.required".lower() not in seen:
                seen.add(f"{driver}.required".lower())
                result.append((f"{driver}.required", "false"))
    return result


def run(cwd: str | Path, args: Sequence[str], *, repo: str | Path | None = None,
        env: Mapping[str, str] | None = None, input: bytes | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``git ARGS`` in ``cwd`` with the hardened environment of ``repo``
    (default: ``cwd``); the completed process (output captured)."""
    return subprocess.run(["git", *args], cwd=cwd, input=input, capture_output=True,
                          env=environment(cwd if repo is None else repo, env), timeout=timeout)
