"""The ``pytest`` verifier: the acceptance commands must pass, and when one is a
pytest run the evidence and the reject reason name the failed tests by node id.

A pytest command gets ``--junitxml`` pointing outside the checkout (and the
xunit1 flavour, whose ``file`` attribute makes node ids exact). A bare
``pytest`` becomes ``<its python> -m pytest`` so the checkout is on
``sys.path``: the tests import the candidate's code, not an installed copy.
Commands that are not pytest run as they are.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import Acceptance, Verdict, run_acceptance
from ledger.processes import CommandResult

#: Failed node ids listed in a reject reason (all of them go to the evidence).
REASON_LIMIT = 10

# A JUnit report larger than this is not parsed (the candidate's code wrote it).
_REPORT_LIMIT = 64 * 1024 * 1024

_EXIT_MEANING = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests were collected"}


@dataclass(frozen=True)
class Report:
    """What a JUnit report says."""

    tests: int
    failed: list[str]  # node ids of failures and errors, in report order
    skipped: int


def pytest_command(argv: Sequence[str]) -> list[str] | None:
    """``argv`` as a ``python -m pytest`` command, or ``None`` if it is not pytest."""
    program = Path(argv[0]).name
    if program in ("pytest", "py.test"):
        return [_interpreter_of(argv[0]), "-m", "pytest", *argv[1:]]
    if program.startswith("python") and (list(argv[1:3]) == ["-m", "pytest"] or
                                         (len(argv) > 1 and argv[1] == "-mpytest")):
        return list(argv)
    return None


def _interpreter_of(script: str) -> str:
    """The Python a pytest script runs under (from its shebang), else ours."""
    resolved = shutil.which(script)
    if resolved is None:
        return sys.executable
    try:
        with open(resolved, "rb") as f:
            head = f.read(4096).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return sys.executable
    if not head or not head[0].startswith("#!"):
        return sys.executable
    words = head[0][2:].split()
    if words and Path(words[0]).name.startswith("python"):
        return words[0]
    if words and Path(words[0]).name == "env" and len(words) > 1:
        return shutil.which(words[1]) or sys.executable
    # pip's launcher for long paths: #!/bin/sh, then '''exec' "/path/python" "$0" "$@"
    for line in head[1:3]:
        match = re.match(r"""'''exec' "?([^"\s]+)""", line)
        if match:
            return match.group(1)
    return sys.executable


def node_id(case: ElementTree.Element) -> str:
    """A testcase's pytest node id (``path/to/test_x.py::Class::test_name[param]``)."""
    name = case.get("name", "")
    classname = case.get("classname", "")
    file = case.get("file")
    if file:
        module = file[:-3].replace("/", ".") if file.endswith(".py") else file
        inner = classname[len(module):].lstrip(".") if classname.startswith(module) else ""
        return "::".join([file, *(inner.split(".") if inner else []), name])
    if not classname:  # a collection error names the module
        return name.replace(".", "/") + ".py"
    # No file attribute: split the dotted path where the classes start.
    parts = classname.split(".")
    split = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts))
    return "::".join(["/".join(parts[:split]) + ".py", *parts[split:], name])


def read_report(path: Path) -> Report | None:
    """Parse a JUnit XML report; ``None`` if there is none (pytest never got
    that far) or it is unreadable."""
    try:
        if path.stat().st_size > _REPORT_LIMIT:
            return None
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    tests, skipped, failed = 0, 0, []
    for case in root.iter("testcase"):
        tests += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(node_id(case))
        elif case.find("skipped") is not None:
            skipped += 1
    return Report(tests=tests, failed=failed, skipped=skipped)


def _reason(result: CommandResult) -> str:
    failed: list[str] = result.extra.get("failed_tests", [])
    if result.timed_out or not failed:
        meaning = _EXIT_MEANING.get(result.exit_code or 0) if result.extra.get("pytest") else None
        return result.describe() + (f" (pytest: {meaning})" if meaning else "")
    shown = ", ".join(failed[:REASON_LIMIT])
    more = f" and {len(failed) - REASON_LIMIT} more" if len(failed) > REASON_LIMIT else ""
    return f"{len(failed)} test(s) failed: {shown}{more}"


class PytestVerifier:
    """Run the acceptance commands; report failed pytest node ids."""

    name = "pytest"

    async def verify(self, checkout: Path, acceptance: Acceptance) -> Verdict:
        """Run the commands in ``checkout`` (pytest ones with a JUnit report)."""
        with tempfile.TemporaryDirectory(prefix="ledger-junit-") as scratch:
            reports = Path(scratch)
            is_pytest: dict[int, bool] = {}

            def prepare(i: int, argv: tuple[str, ...]) -> list[str]:
                command = pytest_command(argv)
                is_pytest[i] = command is not None
                if command is None:
                    return list(argv)
                return [*command, f"--junitxml={reports / f'junit-{i}.xml'}",
                        "-o", "junit_family=xunit1"]

            def annotate(i: int, result: CommandResult) -> CommandResult:
                if not is_pytest[i]:
                    return result
                report = read_report(reports / f"junit-{i}.xml")
                extra = {"pytest": True, "report": report is not None,
                         "failed_tests": report.failed if report else []}
                if report:
                    extra.update(tests=report.tests, skipped=report.skipped)
                return dataclasses.replace(result, extra=extra)

            results, skipped = await run_acceptance(checkout, acceptance, prepare, annotate)
        evidence = {
            "commands": [r.evidence() for r in results], "not_run": skipped,
            "failed_tests": [t for r in results for t in r.extra.get("failed_tests", [])],
        }
        failed = next((r for r in results if not r.passed), None)
        if failed is None:
            return Verdict(accepted=True, evidence=evidence)
        return Verdict(accepted=False, reason=_reason(failed), evidence=evidence)
