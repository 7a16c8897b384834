"""The screen: what the verifier looks for in a candidate's diff before it runs
anything -- non-test code reaching for the test machinery.

The design at length: docs/internals.md (``ledger.git.screen``).
"""

from __future__ import annotations

import posixpath
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

import pathspec

#: Test code: not screened for content (its own protection covers it).
TEST_PATHS = ("tests/", "test/", "testing/", "test_*.py", "*_test.py")
_INFRASTRUCTURE = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "packaging",
                             "ledger_judge", "ledger_judge_run", "sitecustomize", "usercustomize"})


@dataclass(frozen=True)
class Rule:
    """One thing the screen flags: added lines matching ``pattern`` (in files
    matching ``files``, default every text file), or paths for which
    ``path`` says so."""

    name: str
    why: str
    pattern: re.Pattern[str] | None = None
    files: tuple[str, ...] = ()
    path: Any = None  # (path, added) -> bool
    #: for a symbolic link the candidate adds or changes: (path, target) -> bool
    link: Callable[[str, str], bool] | None = None

    def applies_to(self, path: str) -> bool:
        return not self.files or any(PurePosixPath(path).match(f) for f in self.files)


def _basename_in(*names: str) -> Any:
    return lambda path, added: PurePosixPath(path).name in names


def _part_matches(*globs: str) -> Any:
    return lambda path, added: any(PurePosixPath(part).match(g) for part in PurePosixPath(path).parts
                                   for g in globs)


def _conftest_outside_tests(path: str, added: bool) -> bool:
    return PurePosixPath(path).name == "conftest.py" and not _is_test(path)


def _shadowing(path: str, added: bool) -> bool:
    parts = PurePosixPath(path).parts
    if not added or not parts:
        return False
    top = parts[0].removesuffix(".py") if len(parts) == 1 else parts[0]
    if len(parts) == 1 and not parts[0].endswith(".py"):
        return False
    return top in _INFRASTRUCTURE or top in sys.stdlib_module_names


def _link_leaves(path: str, target: str) -> bool:
    """Whether a link at ``path`` to ``target`` points out of the tree: an
    absolute target, one that climbs past the repository's root, one into
    (or at) a ``.git``, or an empty one."""
    if not target or target.startswith(("/", "~")) or "\0" in target or "\\" in target:
        return True
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == ".." or resolved.startswith("../") or resolved.startswith("/"):
        return True
    return ".git" in PurePosixPath(resolved).parts or ".git" in PurePosixPath(target).parts


_PY = ("*.py",)
_WHERE = (r"getcwd\(\)|Path\.cwd\(\)|Path\.home\(\)|expanduser\(|__file__|\bcwd\b\s*\(")
RULES: tuple[Rule, ...] = (
    Rule("pytest-internals", "reaches into pytest's internals or its hook machinery",
         re.compile(r"\b_pytest\b|\bpluggy\b|\bhookimpl\b|^\s*def\s+pytest_\w+\s*\(|\bpytest\.(main|Config|"
                    r"TestReport|CallInfo|Session|Item|Function|hookspec)\b"), _PY),
    Rule("test-detection", "asks whether it is running under a test",
         re.compile(r"sys\.modules.*\b_?(py)?test|\b_?(py)?test\w*\b.*\bin\s+sys\.modules|PYTEST_[A-Z_]+|"
                    r"sys\.argv.*pytest|\bunittest\b.*\bin\s+sys\.modules")),
    Rule("environment-probe", "asks where it runs (paths, host name, user, mounts, cgroups)",
         re.compile(r"(" + _WHERE + r")[^#\n]*(\.startswith|\.endswith|==|!=|\bin\b|\.match\(|\.search\()"
                    r"|[\"'][^\"'\n]*[\"']\s+(not\s+)?in\s+(str\()?(os\.)?(" + _WHERE + r")"
                    r"|os\.path\.(exists|isdir|isfile|lexists|ismount|islink)\(\s*[rbfu]?[\"'](/|~)"
                    r"|Path\(\s*[rbfu]?[\"'](/|~)[^\"'\n]*[\"']\s*\)\s*\.\s*(exists|is_dir|is_file|is_mount|"
                    r"is_symlink|stat|lstat)\b|os\.(access|stat|lstat|listdir|scandir)\(\s*[rbfu]?[\"']/"
                    r"|socket\.gethostname|platform\.(node|uname)|os\.uname|gethostname\(|\bgethostbyname\("
                    r"|os\.get(e|res)?[ug]id|os\.getlogin|getpass\.getuser|pwd\.getpw|grp\.getgr"
                    r"|/proc/|/sys/(fs|class|devices|kernel)|mountinfo|\bcgroup|uid_map|gid_map|boot_id|machine-id"
                    r"|\.dockerenv|containerenv|/cell\b"
                    r"|(environ(\.get)?\s*[\[(]|getenv\()\s*[rbfu]?[\"'](HOME|USER|USERNAME|LOGNAME|HOSTNAME|PWD|"
                    r"OLDPWD|CI|SHLVL|container)[\"']")),
    Rule("hard-exit", "ends the process without the test run's own ending",
         re.compile(r"\b(os|posix)\._exit\b|\bos\.abort\s*\(|\bos\.kill\s*\(\s*os\.getpid|signal\.raise_signal")),
    Rule("report-paths", "names where test reports or the judge live",
         re.compile(r"junit|LEDGER_JUNIT_XML|/cell/(out|judge)|ledger_judge|\.pytest_cache|--result-log",
                    re.IGNORECASE)),
    Rule("interpreter-hooks", "rewires the import system, tracing or other code's frames",
         re.compile(r"sys\.(meta_path|path_hooks|settrace|setprofile|_getframe|addaudithook)|threading\."
                    r"(settrace|setprofile)|\bgc\.get_(objects|referrers)\b|\.f_(back|lineno|locals)\b|"
                    r"__code__\s*=|builtins\.__import__\s*="), _PY),
    Rule("entry-points", "declares a pytest plugin entry point",
         re.compile(r"pytest11"), path=_basename_in("entry_points.txt")),
    Rule("path-files", "adds a .pth file (code the interpreter runs at start-up)",
         path=lambda path, added: path.endswith(".pth")),
    Rule("plugin-manifest", "adds installed-package metadata (a *.dist-info or *.egg-info)",
         path=_part_matches("*.dist-info", "*.egg-info")),
    Rule("pytest-config", "adds or changes a pytest configuration file",
         path=_basename_in("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini")),
    Rule("site-customize", "adds code the interpreter runs at start-up",
         path=_basename_in("sitecustomize.py", "usercustomize.py")),
    Rule("conftest", "adds a conftest.py outside the tests", path=_conftest_outside_tests),
    Rule("compiled-code", "adds compiled code, which cannot be reviewed",
         path=lambda path, added: path.endswith((".pyc", ".pyo", ".so", ".pyd", ".dylib"))
         or "__pycache__" in PurePosixPath(path).parts),
    Rule("shadowing", "adds a top-level module named like the standard library's or the test "
         "machinery's", path=_shadowing),
    Rule("escaping-links", "adds a symbolic link that leaves the tree (an absolute target, past the "
         "repository's root, or into .git)", link=_link_leaves),
)
RULE_NAMES = tuple(r.name for r in RULES)
_TEST_SPEC = pathspec.GitIgnoreSpec.from_lines(TEST_PATHS)
#: Findings listed in a reason (all of them, up to ``_LIMIT``, go to the evidence).
REASON_LIMIT = 5
_LIMIT = 200
_LINE_LIMIT = 1000  # longer added lines are screened by their first characters


def _is_test(path: str) -> bool:
    return _TEST_SPEC.match_file(path)


def check_settings(settings: Mapping[str, Any]) -> None:
    """``ValueError`` for a screen setting that cannot be used."""
    unknown = set(settings.get("rules") or ()) - set(RULE_NAMES)
    if unknown:
        raise ValueError(f"screen.rules: unknown rule(s) {', '.join(sorted(unknown))} "
                         f"(known: {', '.join(RULE_NAMES)})")
    for extra in settings.get("extra") or ():
        try:
            re.compile(str(extra.get("pattern", "")))
        except re.error as exc:
            raise ValueError(f"screen.extra {extra.get('name')!r}: {exc}") from None


@dataclass(frozen=True)
class Finding:
    """Something the screen flagged: where, which rule, the line."""

    path: str
    line: int | None
    rule: str
    why: str
    text: str = ""

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        quoted = f": {self.text.strip()[:120]}" if self.text.strip() else ""
        return f"{where} {self.why} ({self.rule}){quoted}"

    def evidence(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "rule": self.rule, "text": self.text[:300]}


class Screen:
    """The rules a class screens with (``acceptance.screen``)."""

    def __init__(self, settings: Mapping[str, Any] | None = None):
        settings = dict(settings or {})
        check_settings(settings)
        chosen = settings.get("rules")
        names = set(RULE_NAMES if chosen is None else chosen)
        self.rules = [r for r in RULES if r.name in names]
        for extra in settings.get("extra") or ():
            paths = extra.get("paths")
            self.rules.append(Rule(str(extra.get("name") or "extra"), str(extra.get("why") or
                                   "matches a rule of the class"), re.compile(str(extra["pattern"])),
                                   tuple([paths] if isinstance(paths, str) else paths or ())))
        self.exempt = pathspec.GitIgnoreSpec.from_lines(list(settings.get("exempt") or ()))

    @property
    def enabled(self) -> bool:
        return bool(self.rules)

    def findings(self, diff: bytes) -> list[Finding]:
        """What the screen flags in a ``git diff`` (added lines and paths)."""
        found: list[Finding] = []
        for path, added, lines, link in _files(diff):
            if self.exempt.match_file(path):
                continue
            for rule in self.rules:
                if rule.path is not None and rule.path(path, added):
                    found.append(Finding(path, None, rule.name, rule.why))
                if rule.link is not None and link and rule.link(path, _target(lines)):
                    found.append(Finding(path, None, rule.name, rule.why, f"-> {_target(lines)}"))
            if _is_test(path):
                continue
            for number, text in lines:
                for rule in self.rules:
                    if rule.pattern is not None and rule.applies_to(path) and \
                            rule.pattern.search(text[:_LINE_LIMIT]):
                        found.append(Finding(path, number, rule.name, rule.why, text))
            if len(found) >= _LIMIT:
                break
        return found[:_LIMIT]


def describe(findings: Sequence[Finding]) -> str:
    """The reason a screened candidate is refused with."""
    shown = "; ".join(str(f) for f in findings[:REASON_LIMIT])
    more = f" and {len(findings) - REASON_LIMIT} more" if len(findings) > REASON_LIMIT else ""
    return f"the candidate reaches for the test machinery: {shown}{more}"


def _unquote(name: str) -> str:
    """A path as ``git diff`` writes it (C-quoted when it has special characters)."""
    if not (name.startswith('"') and name.endswith('"')):
        return name
    raw = name[1:-1].encode("latin-1", errors="replace")
    out = bytearray()
    i = 0
    escapes = {ord("n"): 10, ord("t"): 9, ord('"'): 34, ord("\\"): 92, ord("a"): 7, ord("b"): 8,
               ord("f"): 12, ord("r"): 13, ord("v"): 11}
    while i < len(raw):
        if raw[i] == 92 and i + 1 < len(raw):
            if raw[i + 1] in escapes:
                out.append(escapes[raw[i + 1]])
                i += 2
                continue
            if i + 3 < len(raw) and all(48 <= c <= 55 for c in raw[i + 1:i + 4]):
                out.append(int(raw[i + 1:i + 4], 8))
                i += 4
                continue
        out.append(raw[i])
        i += 1
    return out.decode("utf-8", errors="replace")


def _target(lines: list[tuple[int, str]]) -> str:
    """A symbolic link's target, from its added "lines" (git shows a link as a file holding it)."""
    return lines[0][1] if lines else ""


def _files(diff: bytes) -> Iterator[tuple[str, bool, list[tuple[int, str]], bool]]:
    """Each file of a diff that the candidate has: its path, whether it is
    new, its added lines (numbered as in the candidate's file), and whether
    it is a symbolic link in the candidate (mode 120000)."""
    path: str | None = None
    added = deleted = link = False
    lines: list[tuple[int, str]] = []
    number = 0
    previous = ""
    hunk = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")
    for raw in diff.split(b"\n"):
        text = raw.decode("utf-8", errors="replace")
        if text.startswith("diff --git "):
            if path is not None and not deleted:
                yield path, added, lines, link
            added = deleted = link = False
            lines, number = [], 0
            # until +++ says otherwise (a binary or a mode-only change has none)
            header = text[len("diff --git "):]
            if header.startswith('"'):
                path = _unquote(header[header.find('" ') + 2:])[2:]
            else:
                path = header.split(" b/", 1)[-1]
        elif number == 0 and text.startswith("new file mode"):
            added = True
            link = text.endswith(" 120000")
        elif number == 0 and text.startswith("new mode"):
            link = text.endswith(" 120000")
        elif number == 0 and text.startswith("index ") and text.endswith(" 120000"):
            link = True
        elif number == 0 and text.startswith("deleted file mode"):
            deleted = True
        elif text.startswith("+++ ") and previous.startswith("--- "):
            target = text[4:]
            if target != "/dev/null":
                path = _unquote(target)[2:]
            number = 0
        elif text.startswith("@@"):
            match = hunk.match(text)
            number = int(match.group(1)) if match else 0
        elif number and text.startswith("+"):
            lines.append((number, text[1:]))
            number += 1
        elif number and text.startswith(" "):
            number += 1
        previous = text
    if path is not None and not deleted:
        yield path, added, lines, link
