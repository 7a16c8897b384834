"""The fixed judge for pytest: how a pytest command runs when Ledger judges
with it (the ``pytest`` verifier, and sensors), and how its verdict is read.

The design at length: docs/internals.md (``ledger.verifiers.judge``).
"""

from __future__ import annotations

import configparser
import contextlib
import hashlib
import json
import math
import os
import random
import shlex
import shutil
import socket
import tempfile
import threading
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

#: The judge's own files (the launcher and the plugin), copied next to each
#: run under names that say nothing (a run sees its launcher's path and its
#: plugin's module name).
INSIDE = Path(__file__).with_name("inside")
_LAUNCHER, _PLUGIN = "ledger_judge_run.py", "ledger_judge.py"
#: The configuration files pytest reads, in the order it prefers them.
CONFIG_FILES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml",
                "tox.ini", "setup.cfg")
# Environment a judged run never gets, whatever the class names.
_DROPPED_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DEBUG")
# Options of the base's addopts the judge owns (with the number of values they take).
_OWNED_OPTIONS = {"-p": 1, "-c": 1, "--config-file": 1, "--rootdir": 1, "--confcutdir": 1,
                  "--junitxml": 1, "--junit-xml": 1, "--basetemp": 1, "--override-ini": 1, "-o": 1,
                  "--noconftest": 0, "--pyargs": 0, "--disable-plugin-autoload": 0}
_STREAM_LIMIT = 64 * 1024 * 1024
_LINE_LIMIT = 4 * 1024 * 1024
#: Characters of node ids an observation keeps (its details are bounded at
#: 256 KiB): the passed ones a confirmation is checked against -- as ids when
#: they fit, else as short digests (``passed_sha256``: the first 12 hex digits
#: of each id's SHA-256, with the modules whose every test passed) -- and the
#: failed ones that make a baseline.
PASSED_CHARS = 120_000
FAILED_CHARS = 60_000
DIGEST_HEX = 12


class JudgeError(ValueError):
    """A judge setting (``acceptance.pytest``) that cannot be used."""


@dataclass(frozen=True)
class JudgeSettings:
    """``acceptance.pytest``: the interpreter, the plugins and the configuration
    of a judged pytest run."""

    python: str | None = None
    plugins: tuple[str, ...] = ()
    config: Literal["base", "class"] = "base"
    ini: Mapping[str, Any] = field(default_factory=dict)
    pythonpath: tuple[str, ...] | None = None

    @classmethod
    def from_spec(cls, spec: Any) -> JudgeSettings:
        """Validate ``acceptance.pytest`` (a mapping, or absent)."""
        if spec is None:
            return cls()
        if not isinstance(spec, Mapping):
            raise JudgeError("acceptance.pytest must be a table")
        unknown = set(spec) - {"python", "plugins", "config", "ini", "pythonpath"}
        if unknown:
            raise JudgeError(f"acceptance.pytest: unknown setting(s) {', '.join(sorted(unknown))}")
        python = spec.get("python")
        if python is not None and (not isinstance(python, str) or not python.startswith("/")):
            raise JudgeError("acceptance.pytest.python must be an absolute path")
        plugins = spec.get("plugins") or []
        if not isinstance(plugins, list) or not all(
                isinstance(p, str) and p and not p.startswith("-") and " " not in p for p in plugins):
            raise JudgeError("acceptance.pytest.plugins must be a list of plugin names (as for -p)")
        config = spec.get("config", "base")
        if config not in ("base", "class"):
            raise JudgeError("acceptance.pytest.config must be 'base' or 'class'")
        ini = spec.get("ini") or {}
        if not isinstance(ini, Mapping):
            raise JudgeError("acceptance.pytest.ini must be a table of pytest settings")
        pythonpath = spec.get("pythonpath")
        if pythonpath is not None and (not isinstance(pythonpath, list) or not all(
                isinstance(p, str) and _relative(p) for p in pythonpath)):
            raise JudgeError("acceptance.pytest.pythonpath must list paths relative to the checkout")
        return cls(python=python, plugins=tuple(plugins), config=config, ini=dict(ini),
                   pythonpath=tuple(pythonpath) if pythonpath is not None else None)


def _relative(path: str) -> bool:
    pure = PurePosixPath(path)
    return not pure.is_absolute() and ".." not in pure.parts


# --- the configuration ------------------------------------------------------------------------

@dataclass(frozen=True)
class PytestConfig:
    """A pytest configuration: its mode (``toml``: native types, as in
    ``pytest.toml``; ``ini``: strings and lists) and its values."""

    mode: Literal["ini", "toml"]
    values: dict[str, Any]
    source: str  # where it came from: "pytest.ini of the base", "the class"


def config_of(files: Mapping[str, bytes]) -> PytestConfig | None:
    """The configuration pytest would read from a tree's root files
    (``files``: name -> content of those of ``CONFIG_FILES`` that exist), or
    ``None``. ``JudgeError`` if the one pytest would choose does not parse."""
    for name in CONFIG_FILES:
        content = files.get(name)
        if content is None:
            continue
        text = content.decode("utf-8", errors="replace")
        try:
            found = _parse(name, text)
        except (tomllib.TOMLDecodeError, configparser.Error) as exc:
            raise JudgeError(f"the base's {name} does not parse: {exc}") from None
        if found is not None:
            return found
    return None


def _parse(name: str, text: str) -> PytestConfig | None:
    source = f"{name} of the base"
    if name.endswith(".toml"):
        document = tomllib.loads(text)
        if name != "pyproject.toml":
            table = document.get("pytest")
            return PytestConfig("toml", dict(table) if isinstance(table, dict) else {}, source)
        tool = document.get("tool", {}).get("pytest")
        if not isinstance(tool, dict):
            return None
        native = {k: v for k, v in tool.items() if k != "ini_options"}
        if native:
            return PytestConfig("toml", native, source)
        ini = tool.get("ini_options")
        return PytestConfig("ini", dict(ini), source) if isinstance(ini, dict) else None
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    section = {"setup.cfg": "tool:pytest"}.get(name, "pytest")
    if not parser.has_section(section):
        return PytestConfig("ini", {}, source) if name in ("pytest.ini", ".pytest.ini") else None
    return PytestConfig("ini", dict(parser.items(section, raw=True)), source)


def files_of(directory: Path) -> dict[str, bytes]:
    """The root configuration files of a checked-out tree (regular files only)."""
    found: dict[str, bytes] = {}
    for name in CONFIG_FILES:
        path = directory / name
        if path.is_file() and not path.is_symlink():
            found[name] = path.read_bytes()[:1 << 20]
    return found


def judged_config(settings: JudgeSettings, files: Mapping[str, bytes]) -> tuple[PytestConfig, list[str]]:
    """The configuration the judge writes, and its ``pythonpath`` entries
    (relative to the checkout): the class's, or the base's without what the
    judge owns."""
    if settings.config == "class":
        config = PytestConfig("ini", dict(settings.ini), "the class")
    else:
        config = config_of(files) or PytestConfig("ini", {}, "none at the base")
    values = dict(config.values)
    declared = values.pop("pythonpath", None)
    for key in ("required_plugins", "confcutdir", "rootdir", "cache_dir"):
        values.pop(key, None)
    if "addopts" in values:
        values["addopts"] = _owned_options_dropped(values["addopts"])
    if settings.pythonpath is not None:
        pythonpath = list(settings.pythonpath)
    else:
        entries = declared.split() if isinstance(declared, str) else list(declared or [])
        pythonpath = [str(p) for p in entries if isinstance(p, str) and _relative(p)]
    return PytestConfig(config.mode, values, config.source), [*pythonpath, "."]


def _owned_options_dropped(addopts: Any) -> Any:
    words = shlex.split(addopts) if isinstance(addopts, str) else [str(a) for a in addopts]
    kept: list[str] = []
    rest = iter(words)
    for word in rest:
        option, sep, _ = word.partition("=")
        if option in _OWNED_OPTIONS:
            value = None if sep or not _OWNED_OPTIONS[option] else next(rest, None)
            if option == "-p" and value is not None and value.startswith("no:"):
                kept += [word, value]  # disabling a plugin is the base's to say
            continue
        if word[:2] in ("-p", "-o") and len(word) > 2 and not word.startswith("--"):
            if word.startswith("-pno:"):
                kept.append(word)
            continue  # -pNAME, -oNAME=VALUE
        kept.append(word)
    return shlex.join(kept) if isinstance(addopts, str) else kept


def toml_text(config: PytestConfig) -> str:
    """The configuration as a TOML file pytest reads with ``-c`` (``[pytest]``
    for native values; ``[tool.pytest.ini_options]`` for INI-style ones)."""
    lines = ["[pytest]" if config.mode == "toml" else "[tool.pytest.ini_options]"]
    for key, value in config.values.items():
        lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() and key.isascii() else _toml_value(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise JudgeError(f"a pytest setting of {value} cannot be written")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise JudgeError(f"a pytest setting of type {type(value).__name__} cannot be written")


# --- the channel ------------------------------------------------------------------------------

class Channel:
    """The verifier's end of the judge's stream: a Unix socket that accepts one
    connection -- the judge plugin's, made before any of the candidate's code
    runs -- and is removed at once, so nothing started later can connect. A
    thread reads the stream (bounded) until the connection closes."""

    def __init__(self, directory: Path, name: str = "channel.sock"):
        self.path = directory / name
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen(1)
        self._listener.settimeout(0.2)
        self._closing = threading.Event()
        self._data = bytearray()
        self.connected = False
        self.overflow = False
        self._thread = threading.Thread(target=self._serve, name="judge-channel", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        connection = None
        try:
            while not self._closing.is_set():
                try:
                    connection, _ = self._listener.accept()
                    break
                except TimeoutError:
                    continue
                except OSError:
                    return
        finally:
            self._listener.close()
            with contextlib.suppress(OSError):
                self.path.unlink()
        if connection is None:
            return
        self.connected = True
        connection.settimeout(0.5)
        with connection:
            while True:
                try:
                    chunk = connection.recv(65536)
                except TimeoutError:
                    if self._closing.is_set():
                        return
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                if len(self._data) + len(chunk) > _STREAM_LIMIT:
                    self.overflow = True
                    return
                self._data += chunk

    def close(self, wait_s: float = 2.0) -> bytes:
        """Stop waiting (the command has exited) and return what was received.
        The connection ends when the test process does; a process that kept
        the socket open is cut off after ``wait_s``."""
        self._thread.join(timeout=0.5 if not self.connected else wait_s)
        self._closing.set()
        self._thread.join(timeout=5)
        return bytes(self._data)


# --- reading the stream -----------------------------------------------------------------------

@dataclass
class Judged:
    """What the judge's stream says of one pytest run."""

    connected: bool
    complete: bool  # hello ... finish, numbered without a gap
    problems: list[str]  # why the stream cannot be trusted (empty: it can)
    exit_status: int | None = None
    collected: list[str] = field(default_factory=list)
    collect_errors: list[str] = field(default_factory=list)
    #: node id -> passed / failed / skipped (passed: set up, called and torn down, all passing)
    outcomes: dict[str, str] = field(default_factory=dict)
    durations_s: float = 0.0

    @property
    def failed(self) -> list[str]:
        """Node ids of collection errors and failed tests, in order."""
        return [*self.collect_errors, *(t for t, o in self.outcomes.items() if o == "failed")]

    @property
    def skipped(self) -> int:
        return sum(1 for o in self.outcomes.values() if o == "skipped")

    @property
    def passed(self) -> list[str]:
        return [t for t, o in self.outcomes.items() if o == "passed"]

    @property
    def trusted(self) -> bool:
        return self.connected and self.complete and not self.problems

    def summary(self) -> dict[str, Any]:
        """The JSON-ready ``details["tests"]`` of an observation: what failed,
        how many ran, and the passed node ids (bounded) a confirmation is
        checked against."""
        passed = self.passed
        failed = _within(self.failed, FAILED_CHARS)
        summary: dict[str, Any] = {
            "collected": len(self.collected) + len(self.collect_errors), "failed": failed,
            "skipped": self.skipped, "passed": len(passed), "judged": self.trusted}
        if len(failed) < len(self.failed):
            summary["failed_complete"] = False
        ids = _within(passed, PASSED_CHARS)
        if len(ids) == len(passed):
            summary["passed_ids"] = ids
        else:
            digests = [hashlib.sha256(t.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_HEX]
                       for t in passed]
            kept = digests[:PASSED_CHARS // (DIGEST_HEX + 3)]
            summary["passed_sha256"] = kept
            failing = {t.split("::", 1)[0] for t, o in self.outcomes.items() if o != "passed"}
            summary["passed_modules"] = _within(sorted({t.split("::", 1)[0] for t in passed} - failing),
                                                FAILED_CHARS)
            summary["passed_ids_complete"] = len(kept) == len(passed)
        if self.problems:
            summary["problems"] = self.problems[:20]
        return summary


def _within(ids: Sequence[str], chars: int) -> list[str]:
    """The first of ``ids`` that fit in ``chars`` characters (as JSON, roughly)."""
    kept: list[str] = []
    used = 0
    for test in ids:
        used += len(test) + 4
        if used > chars:
            break
        kept.append(test)
    return kept


def read_stream(raw: bytes, *, connected: bool, overflow: bool = False, exit_code: int | None,
                wall_s: float | None = None) -> Judged:
    """Check the judge's stream of a run that exited with ``exit_code``."""
    judged = Judged(connected=connected, complete=False, problems=[])
    problems = judged.problems
    if not connected:
        problems.append("the judge never reported (its plugin did not connect)")
        return judged
    if overflow:
        problems.append("the judge's stream exceeded its size limit")
        return judged
    records: list[dict[str, Any]] = []
    lines = raw.split(b"\n")
    tail = lines.pop()  # after the last newline: empty for a whole stream
    for number, line in enumerate(lines):
        if len(line) > _LINE_LIMIT:
            problems.append(f"record {number} of the judge's stream is too long")
            return judged
        try:
            record = json.loads(line)
        except ValueError:
            problems.append(f"record {number} of the judge's stream is not JSON")
            return judged
        if not isinstance(record, dict) or record.get("seq") != number:
            problems.append(f"record {number} of the judge's stream is out of sequence")
            return judged
        records.append(record)
    if tail:
        problems.append("the judge's stream ends mid-record")
    if not records or records[0].get("event") != "hello":
        problems.append("the judge's stream does not start with its hello")
        return judged
    finish = records[-1] if records[-1].get("event") == "finish" else None
    if finish is None:
        problems.append("the judge's stream stops before the end of the run (the process ended "
                        "early, or something cut it off)")
    elif any(r.get("event") == "finish" for r in records[:-1]):
        problems.append("the judge's stream finishes twice")
    collected: list[str] = []
    counted: int | None = None
    tests: dict[str, dict[str, Any]] = {}
    session: int | None = None
    for record in records[1:]:
        event = record.get("event")
        if event == "collected":
            ids = record.get("ids")
            if not isinstance(ids, list) or counted is not None:
                problems.append("the judge's collection records are malformed")
                continue
            collected += [str(i) for i in ids]
        elif event == "collection":
            counted = record.get("count") if isinstance(record.get("count"), int) else -1
        elif event == "collect_error":
            judged.collect_errors.append(str(record.get("id")))
        elif event == "test":
            test = str(record.get("id"))
            if test in tests:
                problems.append(f"{test} was reported twice")
            phases = record.get("phases")
            tests[test] = phases if isinstance(phases, dict) else {}
            duration = record.get("duration")
            if not isinstance(duration, (int, float)) or duration < 0:
                problems.append(f"{test} has no valid duration")
            else:
                judged.durations_s += float(duration)
        elif event == "session":
            session = record.get("exitstatus") if isinstance(record.get("exitstatus"), int) else -1
    judged.collected = collected
    if counted is not None and counted != len(collected):
        problems.append(f"the judge saw {counted} test(s) collected but listed {len(collected)}")
    if finish is not None:
        exit_status = finish.get("exit")
        judged.exit_status = exit_status if isinstance(exit_status, int) else None
        for problem in finish.get("problems") or []:
            problems.append(f"integrity: {problem}")
        if session is not None and session != judged.exit_status:
            problems.append(f"pytest's session ended with {session} but returned {judged.exit_status}")
        if exit_code is not None and exit_code != judged.exit_status:
            problems.append(f"the process exited {exit_code}, but pytest returned {judged.exit_status}")
        if counted is None and judged.exit_status == 0:
            problems.append("the judge never saw the collection finish")
    listed = set(collected)
    unknown = [t for t in tests if t not in listed]
    if unknown:
        problems.append(f"{len(unknown)} test(s) reported that were never collected: "
                        + ", ".join(unknown[:5]))
    for test in collected:
        phases = tests.get(test)
        if phases is None:
            judged.outcomes[test] = "not run"
            continue
        outcome, inconsistent = _outcome(phases)
        if inconsistent:
            problems.append(f"{test}: {inconsistent}")
        judged.outcomes[test] = outcome
    not_run = [t for t, o in judged.outcomes.items() if o == "not run"]
    if not_run and judged.exit_status == 0:
        problems.append(f"{len(not_run)} collected test(s) never reported: {', '.join(not_run[:5])}")
    if wall_s is not None and judged.durations_s > wall_s + 1.0:
        problems.append(f"the tests took {judged.durations_s:.1f}s by their own account, "
                        f"longer than the run ({wall_s:.1f}s)")
    judged.complete = finish is not None
    return judged


def _outcome(phases: Mapping[str, Any]) -> tuple[str, str | None]:
    """A test's outcome from its phases (``passed`` only if set up, called and
    torn down, each passing by its raw outcome and its report, not xfail), and
    what is inconsistent in them."""
    seen: dict[str, tuple[Any, Any, bool]] = {}
    for when in ("setup", "call", "teardown"):
        phase = phases.get(when)
        if isinstance(phase, dict):
            seen[when] = (phase.get("raw"), phase.get("outcome"), bool(phase.get("xfail")))
    for when, (raw, outcome, _) in seen.items():
        if outcome == "passed" and raw != "passed":
            return "failed", f"its {when} raised ({raw}), but its report says passed"
        if raw == "skipped" and outcome not in ("skipped",):
            return "failed", f"its {when} was skipped, but its report says {outcome}"
        if outcome not in ("passed", "failed", "skipped"):
            return "failed", f"its {when} has no report"
    if any(outcome == "failed" for _, outcome, _ in seen.values()):
        return "failed", None
    if any(outcome == "skipped" or xfail for _, outcome, xfail in seen.values()):
        return "skipped", None
    if set(seen) != {"setup", "call", "teardown"}:
        missing = ", ".join(w for w in ("setup", "call", "teardown") if w not in seen)
        return "failed", f"no {missing} phase was reported"
    return "passed", None


# --- the command ------------------------------------------------------------------------------

def remove_bytecode(checkout: Path) -> int:
    """Remove compiled Python from a checkout before it is judged (a committed
    ``.pyc`` whose header matches its source would be loaded instead of it);
    returns how many files went. Not followed through links."""
    removed = 0
    for directory, dirs, files in os.walk(checkout):
        for name in list(dirs):
            if name == "__pycache__":
                dirs.remove(name)
                path = Path(directory) / name
                removed += sum(1 for p in path.rglob("*") if p.is_file())
                shutil.rmtree(path, ignore_errors=True)
        for name in files:
            if name.endswith((".pyc", ".pyo")):
                with contextlib.suppress(OSError):
                    (Path(directory) / name).unlink()
                    removed += 1
    return removed


@dataclass
class Prepared:
    """One judged pytest command, ready to run: its argv and environment
    additions, its channel, and the directory to remove afterwards."""

    argv: list[str]
    channel: Channel
    directory: Path


_RANDOM = random.SystemRandom()


def _name() -> str:
    """A module name that says nothing (and is nobody's module)."""
    return "_" + "".join(_RANDOM.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10))


class Judge:
    """Judged pytest runs under one directory (``root``, removed by ``close``),
    seen by each run where its cell binds it (``prepare``'s ``seen_root``;
    the directory itself outside a cell). Nothing in it is named for Ledger:
    a test process sees its launcher's path, its plugin's module name and
    its configuration file's path."""

    def __init__(self, settings: JudgeSettings, config_files: Mapping[str, bytes], *,
                 sandboxed: bool, work_dir: Path | None = None):
        self.settings = settings
        self.config, self.pythonpath = judged_config(settings, config_files)
        self.sandboxed = sandboxed
        self.root = Path(tempfile.mkdtemp(dir=work_dir))
        (self.root / "lib").mkdir()
        self.plugin = _name()
        self.launcher = f"{_name()[1:]}.py"
        shutil.copyfile(INSIDE / _LAUNCHER, self.root / "lib" / self.launcher)
        shutil.copyfile(INSIDE / _PLUGIN, self.root / "lib" / f"{self.plugin}.py")
        (self.root / "config.toml").write_text(toml_text(self.config))
        self.root.chmod(0o755)
        self._runs = 0

    def interpreter(self, argv: Sequence[str]) -> str:
        """The Python the judged run uses: the class's, else the command's."""
        if self.settings.python:
            return self.settings.python
        return argv[0]

    def read_only(self) -> list[str]:
        """Host directories a cell must see read-only for the class's interpreter."""
        if not self.settings.python:
            return []
        found = []
        for path in (Path(self.settings.python), Path(os.path.realpath(self.settings.python))):
            prefix = str(path.parent.parent)
            if not prefix.startswith("/usr") and prefix not in ("/", "") and prefix not in found:
                found.append(prefix)
        return found

    def prepare(self, python: str, arguments: Sequence[str], checkout: str,
                seen_root: str | None = None) -> Prepared:
        """A judged command running pytest with ``arguments`` (the class's own,
        after ``-m pytest``) on the checkout seen at ``checkout``, the
        judge's directory seen at ``seen_root`` (in a cell: where its cell
        binds ``root``)."""
        self._runs += 1
        name = _name()[1:7]
        run = self.root / name
        run.mkdir()
        run.chmod(0o755)
        channel = Channel(run, f"{_name()[1:9]}.sock")
        seen = seen_root or str(self.root)
        argv = [python, "-I", f"{seen}/lib/{self.launcher}", "--plugin", self.plugin,
                "--channel", f"{seen}/{name}/{channel.path.name}", "--checkout", checkout]
        for entry in self.pythonpath:
            argv += ["--pythonpath", entry]
        argv += ["--", "-c", f"{seen}/config.toml", f"--rootdir={checkout}", f"--confcutdir={checkout}"]
        for plugin in self.settings.plugins:
            argv += ["-p", plugin]
        argv += list(arguments)
        return Prepared(argv=argv, channel=channel, directory=run)

    @staticmethod
    def environment(extras: Sequence[str]) -> list[str]:
        """The environment extras of a judged run: the class's, without what
        would load plugins or options behind the judge's back. (Plugin
        auto-loading is turned off by the launcher itself, for pytest only:
        the test process's environment does not say so.)"""
        return [e for e in extras if e.partition("=")[0] not in _DROPPED_ENV]

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
