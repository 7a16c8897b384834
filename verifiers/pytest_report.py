"""The ``pytest`` verifier: the acceptance commands must pass, and when one is a
pytest run the evidence and the reject reason name the failed tests by node id.

It is also held to the observation that opened the campaign
(``acceptance.baseline``, from a sensor that ran pytest): every test that
failed then must *pass* now -- a test that is skipped, xfailed, deselected or
gone does not count -- the number of tests collected must not drop and the
number skipped must not rise. A rejection names the tests.

A pytest command runs by the fixed judge (``ledger.verifiers.judge``): Ledger's
interpreter settings, plugins and configuration, and a verdict read from the
judge plugin's stream, never from a report the run wrote: an exit 0 whose
stream is missing, partial or inconsistent is a failure. A bare ``pytest``
runs under the Python of its script. Commands that are not pytest run as they
are. With held-out acceptance (copied into the checkout by the runtime), every
held-out test must pass too.

Sensors run pytest by the same judge, so the node ids of an observation and of
a verdict are spelt alike; ``junit_arguments`` and ``read_report`` remain for a
sensor's wrapper that writes a JUnit report to ``$LEDGER_JUNIT_XML`` (such a
report can open a campaign, never confirm one).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledger.sandbox.processes import CommandResult

from . import Acceptance, Baseline, Verdict, Where, held_out_reason, passed, run_acceptance
from .judge import Judge, Judged, Prepared, read_stream, remove_bytecode

#: Failed node ids listed in a reject reason (all of them go to the evidence).
REASON_LIMIT = 10

# A JUnit report larger than this is not parsed (the candidate's code wrote it).
_REPORT_LIMIT = 64 * 1024 * 1024

#: What pytest's exit codes other than 0 (passed) and 1 (tests failed) mean:
#: each says the run itself went wrong (sensors record it as an error).
PYTEST_EXIT_MEANING = {2: "interrupted", 3: "internal error", 4: "usage error", 5: "no tests were collected"}
_EXIT_MEANING = PYTEST_EXIT_MEANING


@dataclass(frozen=True)
class Report:
    """What a JUnit report says."""

    tests: int
    failed: list[str]  # node ids of failures and errors, in report order
    skipped: int  # skipped and xfailed
    outcomes: dict[str, str] = field(default_factory=dict)  # node id -> passed, failed, skipped

    def summary(self) -> dict[str, Any]:
        """The JSON-ready record a sensor keeps with its observation (the
        baseline a later verdict is held to)."""
        return {"collected": self.tests, "failed": self.failed, "skipped": self.skipped,
                "passed": sum(1 for o in self.outcomes.values() if o == "passed")}


def junit_arguments(report: Path) -> list[str]:
    """What a pytest command gets so that ``read_report(report)`` can read it."""
    return [f"--junitxml={report}", "-o", "junit_family=xunit1"]


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
    # The file was written by code of the candidate's (in its cell): a regular
    # file only, never read through a link to somewhere on the verifier's host.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _REPORT_LIMIT:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            root = ElementTree.parse(f).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    finally:
        os.close(fd)
    tests, skipped, failed, outcomes = 0, 0, [], {}
    for case in root.iter("testcase"):
        tests += 1
        name = node_id(case)
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
            outcomes[name] = "failed"
        elif case.find("skipped") is not None:
            skipped += 1
            outcomes.setdefault(name, "skipped")
        else:
            outcomes.setdefault(name, "passed")
    return Report(tests=tests, failed=failed, skipped=skipped, outcomes=outcomes)


def _reason(result: CommandResult) -> str:
    failed: list[str] = result.extra.get("failed_tests", [])
    if result.timed_out or not failed:
        meaning = _EXIT_MEANING.get(result.exit_code or 0) if result.extra.get("pytest") else None
        return result.describe() + (f" (pytest: {meaning})" if meaning else "")
    shown = ", ".join(failed[:REASON_LIMIT])
    more = f" and {len(failed) - REASON_LIMIT} more" if len(failed) > REASON_LIMIT else ""
    return f"{len(failed)} test(s) failed: {shown}{more}"


def held_to(baseline: Baseline, reports: Sequence[Report]) -> list[str]:
    """What the reports of a passing run fall short of against the opening
    observation (empty: nothing)."""
    outcomes: dict[str, str] = {}
    for report in reports:
        outcomes.update(report.outcomes)

    def outcome(test: str) -> str:
        if test in outcomes:
            return outcomes[test]
        if "::" not in test:  # a module that failed to collect: judged by its tests now
            inside = [o for k, o in outcomes.items() if k.startswith(test + "::")]
            if inside:
                return next((o for o in inside if o != "passed"), "passed")
        return "not run"

    problems = []
    short = [(t, o) for t in baseline.failed if (o := outcome(t)) != "passed"]
    if short:
        shown = ", ".join(f"{t} ({o})" for t, o in short[:REASON_LIMIT])
        more = f" and {len(short) - REASON_LIMIT} more" if len(short) > REASON_LIMIT else ""
        problems.append(f"{len(short)} test(s) that failed at opening do not pass now: {shown}{more}")
    collected = sum(r.tests for r in reports)
    if baseline.collected is not None and collected < baseline.collected:
        problems.append(f"{collected} test(s) collected, {baseline.collected} at opening")
    skipped = sum(r.skipped for r in reports)
    if baseline.skipped is not None and skipped > baseline.skipped:
        problems.append(f"{skipped} test(s) skipped or xfailed, {baseline.skipped} at opening")
    return problems


def report_of(judged: Judged) -> Report:
    """A judged run as a ``Report`` (what ``held_to`` compares)."""
    outcomes = dict(judged.outcomes)
    outcomes.update({e: "failed" for e in judged.collect_errors})
    return Report(tests=len(judged.collected) + len(judged.collect_errors), failed=judged.failed,
                  skipped=judged.skipped, outcomes=outcomes)


class JudgeUnavailable(RuntimeError):
    """The judge could not start (no candidate code had run): not a verdict."""


class PytestVerifier:
    """Run the acceptance commands, pytest ones by the fixed judge
    (``ledger.verifiers.judge``); report failed node ids; hold a passing run to the
    opening observation and require every held-out test to pass."""

    name = "pytest"

    async def verify(self, checkout: Path, acceptance: Acceptance) -> Verdict:
        """Run the commands in ``checkout``; a pytest command's verdict is read
        from the judge's stream, never from what the run wrote."""
        reports: list[Report] = []
        ran_pytest = False
        remove_bytecode(checkout)
        judge = Judge(acceptance.pytest, acceptance.config_files, sandboxed=acceptance.sandboxed)
        prepared: dict[int, Prepared] = {}
        problems: list[str] = []
        held_out: list[Judged] = []
        try:
            cell = acceptance.cell
            if acceptance.sandboxed and judge.read_only():
                cell = cell.model_copy(update={"read_only": [*cell.read_only, *judge.read_only()]})
            acceptance = dataclasses.replace(
                acceptance, environment=tuple(Judge.environment(acceptance.environment)), cell=cell)

            def prepare(i: int, argv: tuple[str, ...], where: Where) -> list[str]:
                command = pytest_command(argv)
                if command is None:
                    return list(argv)
                arguments = command[3:]
                if acceptance.held_out is not None and acceptance.held_out_source is None \
                        and not acceptance.is_held_out(i):
                    # held-out tests already in the checkout run on their own,
                    # after: never counted with (nor compared like) the
                    # candidate's own (placed by the runtime, they are not
                    # there before their own commands run)
                    arguments = [*arguments, f"--ignore={acceptance.held_out}"]
                run = judge.prepare(judge.interpreter(command), arguments, where.checkout,
                                    seen_root=where.judge if acceptance.sandboxed else None)
                prepared[i] = run
                return run.argv

            def annotate(i: int, result: CommandResult) -> CommandResult:
                nonlocal ran_pytest
                run = prepared.get(i)
                if run is None:
                    return result
                ran_pytest = True
                raw = run.channel.close()
                judged = read_stream(raw, connected=run.channel.connected, overflow=run.channel.overflow,
                                     exit_code=result.exit_code, wall_s=result.duration_s)
                if not judged.connected and not result.timed_out and result.exit_code not in (None, 0):
                    raise JudgeUnavailable(f"the judge did not start: {result.describe()}: "
                                           f"{result.output[-500:]}")
                report = report_of(judged)
                reports.append(report)
                extra: dict[str, Any] = {"pytest": True, "judged": judged.trusted,
                                         "failed_tests": report.failed, "tests": report.tests,
                                         "skipped": report.skipped, "config": judge.config.source}
                if judged.problems:
                    extra["judge_problems"] = judged.problems[:20]
                if acceptance.is_held_out(i):
                    held_out.append(judged)
                    extra["held_out"] = True
                if result.passed and not judged.trusted:
                    shown = "; ".join(judged.problems[:3])
                    extra["refused"] = f"pytest exited 0, but the judge's report cannot be trusted: {shown}"
                    if not acceptance.is_held_out(i):  # a held-out one is a held-out failure, below
                        problems.append(extra["refused"])
                return dataclasses.replace(result, extra=extra)

            results, skipped = await run_acceptance(checkout, acceptance, prepare, annotate, judge=judge.root)
        finally:
            for run in prepared.values():
                run.channel.close(0.1)
            judge.close()
        evidence: dict[str, Any] = {
            "commands": [r.evidence() for r in results], "not_run": skipped,
            "failed_tests": [t for r in results for t in r.extra.get("failed_tests", [])],
            "judge": {"config": judge.config.source, "plugins": list(acceptance.pytest.plugins),
                      "pythonpath": judge.pythonpath},
        }
        if problems:
            evidence["judge"]["problems"] = problems
            return Verdict(accepted=False, reason=problems[0], evidence=evidence)
        failed_at = next((i for i, r in enumerate(results) if not passed(r)), None)
        failed = results[failed_at] if failed_at is not None else None
        if failed_at is not None and failed is not None and acceptance.is_held_out(failed_at):
            # the reason names nothing of the held-out checks (the next
            # attempt is told it); the evidence, for operators, has it all
            short = list(failed.extra.get("failed_tests") or [])
            evidence["held_out"] = {"into": acceptance.held_out, "failed": short[:200],
                                    "reason": _reason(failed) if not failed.extra.get("refused")
                                    else failed.extra["refused"]}
            return Verdict(accepted=False, evidence=evidence, reason=held_out_reason(len(short) or 1))
        if failed is not None:
            return Verdict(accepted=False, reason=_reason(failed), evidence=evidence)
        baseline = acceptance.baseline
        passed_count = sum(1 for r in reports for o in r.outcomes.values() if o == "passed")
        summary = (f"{len(results)} command(s) passed; {passed_count} test(s) passed, "
                   f"{sum(r.skipped for r in reports)} skipped (judged)")
        if acceptance.held_out is not None:
            summary += f"; {sum(len(j.passed) for j in held_out)} held-out passed"
        if baseline is None or not ran_pytest:
            if (refused := self._held_out(acceptance, held_out, evidence)) is not None:
                return refused
        if baseline is None:
            evidence.update(baseline="none: the opening observation reported no tests",
                            summary=summary)
            return Verdict(accepted=True, evidence=evidence)
        evidence["baseline"] = {"failed": list(baseline.failed), "collected": baseline.collected,
                                "skipped": baseline.skipped}
        if not ran_pytest:
            evidence["summary"] = summary + "; not compared with the opening observation (no pytest command)"
            return Verdict(accepted=True, evidence=evidence)
        main_reports = reports[:len(reports) - len(held_out)] if held_out else reports
        shortfall = held_to(baseline, main_reports)
        if shortfall:
            return Verdict(accepted=False, reason="; ".join(shortfall), evidence=evidence)
        if (refused := self._held_out(acceptance, held_out, evidence)) is not None:
            return refused
        evidence["summary"] = (summary + f"; the {len(baseline.failed)} test(s) that failed at "
                               "opening pass")
        return Verdict(accepted=True, evidence=evidence)

    @staticmethod
    def _held_out(acceptance: Acceptance, held_out: list[Judged], evidence: dict[str, Any]) -> Verdict | None:
        """A rejection if a held-out test does not pass (``None``: all pass, or none declared)."""
        if acceptance.held_out is None:
            return None
        if not held_out or not any(j.collected for j in held_out):
            raise JudgeUnavailable(f"the held-out acceptance at {acceptance.held_out} collected no "
                                   "tests: a held-out directory of pytest tests, run by a pytest "
                                   "command, is needed")
        evidence["held_out"] = {"into": acceptance.held_out, "passed": sum(len(j.passed) for j in held_out)}
        short = [t for j in held_out for t, o in j.outcomes.items() if o != "passed"]
        if short:
            evidence["held_out"].update(failed=short[:200],
                                        reason=f"{len(short)} held-out test(s) do not pass: "
                                        + ", ".join(short[:REASON_LIMIT]))
            return Verdict(accepted=False, evidence=evidence, reason=held_out_reason(len(short)))
        return None
