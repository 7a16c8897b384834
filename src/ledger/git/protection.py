"""Protected paths: what a candidate may not change -- the tests that judge it,
what configures them, CI files, and whatever the acceptance commands name.

A class lists them in ``acceptance.protected`` as gitignore-style patterns
(``tests/``, ``conftest.py``, ``/ci/run.sh``), or as ``PATTERN#SECTION`` for one
section of a configuration file (``pyproject.toml#tool.pytest``,
``setup.cfg#tool:pytest``, ``tox.ini#pytest``, ``package.json#scripts``): there
only that section is protected, the rest of the file stays the agent's to
change. Without a list, ``default_patterns`` derives one from the acceptance
commands.

The worker refuses a candidate that changes a protected path before it is
recorded; the verifier, which does not rely on that, restores the protected
paths from the base commit over the candidate on its own checkout and rejects
the candidate if that changed anything -- a verdict on restored tests would
judge a tree other than the one that lands. A class may allow such changes
(``acceptance.allow_protected_changes``).
"""

from __future__ import annotations

import configparser
import json
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pathspec

from ledger.git import repository

SECTION = "#"

#: Tests and the files that configure them, whatever the acceptance command.
TEST_PATTERNS = ("tests/", "test/", "testing/", "conftest.py", "test_*.py", "*_test.py",
                 "pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml#tool.pytest",
                 "setup.cfg#tool:pytest", "tox.ini#pytest", "noxfile.py")
#: What the interpreter and the test runner load without being asked: plugin
#: manifests (a ``*.dist-info`` on the import path declares entry points),
#: start-up hooks, and git attributes (filters and diff drivers).
LOADED_PATTERNS = ("*.dist-info/", "*.egg-info/", "sitecustomize.py", "usercustomize.py", ".gitattributes")
#: Continuous-integration definitions.
CI_PATTERNS = (".github/", ".gitlab-ci.yml", ".gitlab/", ".circleci/", "/.ci/", "Jenkinsfile",
               ".travis.yml", "azure-pipelines.yml", ".buildkite/")
#: What a test runner reads, by the program the acceptance command runs.
PROGRAM_INPUTS: Mapping[str, tuple[str, ...]] = {
    "tox": ("tox.ini", "pyproject.toml#tool.tox", "setup.cfg#tox"),
    "nox": ("noxfile.py",),
    "make": ("/Makefile", "/makefile", "/GNUmakefile"),
    "npm": ("package.json#scripts",), "yarn": ("package.json#scripts",),
    "pnpm": ("package.json#scripts",),
}
# An argument that names a file of the repository: relative, no option, no
# code (spaces, quotes, brackets), and a name with an extension. Directories
# are left out on purpose: `pytest src/pkg` must not protect the code to fix.
_PATH_ARGUMENT = re.compile(r"^(?!-)(?!/)(?:[\w.+@-]+/)*[\w+@-][\w+@-]*\.[\w.+@-]+$")
# Options whose value is a module or an expression, never a path.
_NOT_A_PATH_AFTER = frozenset({"-m", "-k", "-W", "-X"})


def default_patterns(commands: Sequence[Sequence[str]]) -> list[str]:
    """The protected patterns of an acceptance that runs ``commands``: tests and
    their configuration, plugin manifests and start-up hooks, CI files, the inputs of the runner each command starts
    (``tox.ini`` for tox, the Makefile for make ...), a relative program
    (``./run_tests.sh``) and every relative file an argument names (a test
    module, ``-c ci/pytest.ini``)."""
    patterns = [*TEST_PATTERNS, *LOADED_PATTERNS, *CI_PATTERNS]
    for argv in commands:
        if not argv:
            continue
        program = PurePosixPath(argv[0]).name
        patterns += PROGRAM_INPUTS.get(program, ())
        if not argv[0].startswith("/") and "/" in argv[0]:  # ./run_tests.sh, scripts/test
            patterns.append(_anchored(argv[0]))
        previous = ""
        for arg in argv[1:]:
            value = arg.split("::", 1)[0]  # a pytest node id names its file
            if previous not in _NOT_A_PATH_AFTER and _PATH_ARGUMENT.match(value):
                patterns.append(_anchored(value))
            previous = arg
    return list(dict.fromkeys(patterns))


def _anchored(path: str) -> str:
    clean = path[2:] if path.startswith("./") else path
    return "/" + clean.rstrip("/")


def check_pattern(pattern: str) -> str:
    """Validate one protected pattern; ``ValueError`` if it is empty or malformed."""
    files, sep, section = pattern.partition(SECTION)
    if not files.strip() or (sep and not section.strip()):
        raise ValueError(f"protected pattern {pattern!r} is empty (PATTERN or PATTERN#SECTION)")
    try:
        pathspec.GitIgnoreSpec.from_lines([files])
    except (ValueError, TypeError) as exc:
        raise ValueError(f"protected pattern {pattern!r}: {exc}") from None
    return pattern


def patterns_of(acceptance: Mapping[str, Any]) -> list[str]:
    """The protected patterns an acceptance spec declares, else its defaults."""
    declared = acceptance.get("protected")
    if isinstance(declared, list):
        return [str(p) for p in declared]
    commands = acceptance.get("commands") or []
    return default_patterns([[str(a) for a in argv] for argv in commands if isinstance(argv, list)])


@dataclass(frozen=True)
class Change:
    """A protected path (or section of one) that a candidate changed."""

    path: str
    section: str | None = None

    def __str__(self) -> str:
        return f"{self.path} [{self.section}]" if self.section else self.path


class Protection:
    """A compiled set of protected patterns."""

    def __init__(self, patterns: Sequence[str]):
        self.patterns = [check_pattern(p) for p in patterns]
        whole = [p for p in self.patterns if SECTION not in p]
        self._whole = pathspec.GitIgnoreSpec.from_lines(whole)
        self._sections = [(pathspec.GitIgnoreSpec.from_lines([p.partition(SECTION)[0]]),
                           p.partition(SECTION)[2]) for p in self.patterns if SECTION in p]

    @classmethod
    def of(cls, acceptance: Mapping[str, Any]) -> Protection:
        """The protection an acceptance spec declares (or its defaults)."""
        return cls(patterns_of(acceptance))

    def covers(self, path: str) -> bool:
        """Whether ``path`` is protected whole."""
        return self._whole.match_file(path)

    def changes(self, repo: Path, base: str, candidate: str) -> list[Change]:
        """What of the protected the candidate changed, compared with the base
        (both commits must be in ``repo``)."""
        found: list[Change] = []
        for path in repository.changed_paths(repo, base, candidate):
            if self.covers(path):
                found.append(Change(path))
                continue
            for spec, section in self._sections:
                if spec.match_file(path) and (
                        _section(path, repository.file_at(repo, base, path), section)
                        != _section(path, repository.file_at(repo, candidate, path), section)):
                    found.append(Change(path, section))
        return found


def describe(changes: Sequence[Change], limit: int = 10) -> str:
    """``a, b [tool.pytest] and 3 more``."""
    shown = ", ".join(str(c) for c in changes[:limit])
    return shown + (f" and {len(changes) - limit} more" if len(changes) > limit else "")


def _section(path: str, content: bytes | None, section: str) -> Any:
    """The value of ``section`` in a TOML, JSON or INI file (``None`` if the file
    or the section is missing); a file that does not parse counts as its bytes."""
    if content is None:
        return None
    text = content.decode("utf-8", errors="replace")
    suffix = PurePosixPath(path).suffix.lower()
    try:
        if suffix in (".toml", ".json"):
            value: Any = tomllib.loads(text) if suffix == ".toml" else json.loads(text)
            for key in section.split("."):
                if not isinstance(value, dict) or key not in value:
                    return None
                value = value[key]
            return value
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        parser.read_string(text)
        return dict(parser.items(section, raw=True)) if parser.has_section(section) else None
    except (ValueError, configparser.Error):
        return ("unparsed", content)
