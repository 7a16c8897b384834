"""Verifier implementations: how a candidate's acceptance is judged. A plugin
is a class with ``async verify(checkout, acceptance) -> Verdict``, found by
its name in the ``ledger.verifiers`` entry-point group; ``Acceptance`` (the
run of a typed spec, ``ledger.verifiers.spec``) is what it is given.

The design at length: docs/internals.md (``ledger.verifiers``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import ValidationError

from ledger.sandbox import guise as guises
from ledger.sandbox.cell import Binding, CellPolicy, CellSpec, taken_accounts
from ledger.sandbox.processes import (
    CommandResult,
    cell_environment,
    child_environment,
    run_command,
)

from .judge import JudgeError, JudgeSettings
from .spec import AcceptanceSpec

ENTRY_POINT_GROUP = "ledger.verifiers"

#: The implementations shipped with Ledger, by name (also declared as entry points;
#: listed here so a source checkout works without installing).
BUILTINS: dict[str, str] = {
    "command": "ledger.verifiers.command:CommandVerifier",
    "pytest": "ledger.verifiers.pytest_report:PytestVerifier",
    "review": "ledger.verifiers.review:ReviewVerifier",
}


class InvalidAcceptance(ValueError):
    """An acceptance spec that cannot be run."""


def _first_error(exc: ValueError) -> str:
    """A validation error as one line: where, and what is wrong there."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"acceptance {where}: {first['msg']}" if where else f"acceptance: {first['msg']}"
    return str(exc)


class UnknownVerifier(LookupError):
    """No implementation of that name is installed."""


@dataclass(frozen=True)
class Baseline:
    """The tests the observation that opened the campaign saw: the node ids that
    failed (or errored), and how many were collected and skipped."""

    failed: tuple[str, ...]
    collected: int | None = None
    skipped: int | None = None

    @classmethod
    def from_tests(cls, tests: Any) -> Baseline | None:
        """From a sensor's ``details["tests"]`` (``{"failed": [...], "collected": n,
        "skipped": n}``); ``None`` if there is no usable report."""
        if not isinstance(tests, Mapping) or not isinstance(tests.get("failed"), list):
            return None
        return cls(failed=tuple(str(t) for t in tests["failed"]),
                   collected=_count(tests.get("collected")), skipped=_count(tests.get("skipped")))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


@dataclass(frozen=True)
class Acceptance:
    """What to run on the clean checkout: argv lists, and one time budget for
    all of them together (``timeout_s``); the extra environment the commands
    get; the opening observation's tests, when known; the cell the commands
    run in (``cell``; its ``sandbox = false`` runs them as the verifier's own
    user), and a directory they may write reports to (``outputs``: seen at
    ``/cell/out`` in the cell; ``seen_outputs`` says where).

    Set by the runtime for the judge: how pytest runs (``pytest``, from
    ``acceptance.pytest``) and the base commit's configuration files
    (``config_files``); the held-out acceptance (``held_out``: where in the
    checkout its commands find it; ``held_out_source``: the verifier's copy,
    put there -- read-only, in a cell -- for those commands only; its
    commands are ``commands[held_out_from:]``); what the checkout is called
    on an ordinary machine (``project``, for the runs' guises); the spec's
    ``review`` settings and what a reviewer is shown (``context``:
    objective, diff, the verdicts so far)."""

    commands: tuple[tuple[str, ...], ...]
    timeout_s: float
    environment: tuple[str, ...] = ()
    baseline: Baseline | None = None
    cell: CellPolicy = field(default_factory=CellPolicy)
    outputs: Path | None = None
    pytest: JudgeSettings = field(default_factory=JudgeSettings)
    config_files: Mapping[str, bytes] = field(default_factory=dict)
    held_out: str | None = None
    held_out_from: int | None = None
    held_out_source: Path | None = None
    project: str | None = None
    review: Mapping[str, Any] = field(default_factory=dict)
    context: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sandboxed(self) -> bool:
        """Whether the commands run in a cell."""
        return self.cell.sandbox

    def with_outputs(self, outputs: Path) -> Acceptance:
        """The same acceptance, with a directory for the commands' reports."""
        return dataclasses.replace(self, outputs=outputs)

    def with_held_out(self, into: str, commands: Sequence[Sequence[str]],
                      source: Path | None = None) -> Acceptance:
        """The same acceptance, with held-out tests at ``into`` in the
        checkout (from ``source`` for their own commands only; ``None``:
        already there) and ``commands`` run after the others."""
        return dataclasses.replace(self, commands=(*self.commands, *(tuple(c) for c in commands)),
                                   held_out=into, held_out_from=len(self.commands), held_out_source=source)

    def is_held_out(self, index: int) -> bool:
        """Whether command ``index`` is one of the held-out acceptance's."""
        return self.held_out_from is not None and index >= self.held_out_from

    @classmethod
    def from_spec(cls, spec: AcceptanceSpec | Mapping[str, Any], baseline: Baseline | None = None,
                  *, require_commands: bool = True) -> Acceptance:
        """The run of an acceptance spec (``ledger.verifiers.spec``; a mapping
        is read as a stored one); a reviewer needs no commands
        (``require_commands=False``). ``InvalidAcceptance`` says what is wrong."""
        if not isinstance(spec, AcceptanceSpec):
            if not isinstance(spec, Mapping):
                raise InvalidAcceptance("the acceptance spec must be a mapping")
            try:
                spec = AcceptanceSpec.stored(spec)
            except ValueError as exc:
                raise InvalidAcceptance(_first_error(exc)) from None
        if require_commands and not spec.commands:
            raise InvalidAcceptance("the acceptance spec has no commands: nothing would be checked")
        try:
            judge = JudgeSettings.from_spec(spec.pytest.model_dump())
        except JudgeError as exc:
            raise InvalidAcceptance(str(exc)) from None
        return cls(commands=tuple(tuple(argv) for argv in spec.commands),
                   timeout_s=spec.timeout_s, environment=tuple(spec.environment),
                   baseline=baseline, cell=spec.cell, pytest=judge,
                   review=spec.review.model_dump() if spec.review else {})


@dataclass(frozen=True)
class Verdict:
    """An implementation's judgement: accepted, or rejected with a reason;
    ``evidence`` is stored with the verdict (JSON-ready)."""

    accepted: bool
    reason: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.accepted and not self.reason:
            raise ValueError("a rejection needs a reason")


@runtime_checkable
class Implementation(Protocol):
    """A verifier implementation."""

    name: str

    async def verify(self, checkout: Path, acceptance: Acceptance) -> Verdict:
        """Judge the candidate checked out at ``checkout`` against ``acceptance``."""
        ...


@dataclass(frozen=True)
class Where:
    """Where one acceptance command finds things: its checkout, the outputs
    directory, the judge's files (``judge``: bound read-only there), and the
    face of its cell (``guise``; ``None``: no cell, the host's paths)."""

    checkout: str
    outputs: str | None
    judge: str
    guise: guises.Guise | None = None


def where_for(checkout: Path, acceptance: Acceptance, judge: Path | None = None) -> Where:
    """A fresh ``Where`` for one command: in a cell, a new guise of the
    verifier's family (so no two runs that judge a candidate look alike)."""
    if not acceptance.sandboxed:
        outputs = str(acceptance.outputs) if acceptance.outputs is not None else None
        return Where(str(checkout), outputs, str(judge) if judge is not None else "")
    uids, names = taken_accounts()
    guise = guises.draw("verifier", acceptance.project or guises.project_name(None),
                        taken_uids=uids, taken_names=names)
    return Where(guise.checkout, guise.outputs if acceptance.outputs is not None else None,
                 guise.scratch, guise)


HELD_OUT_FAILED = "{n} held-out check(s) failed"


def held_out_reason(failed: int) -> str:
    """The reason a held-out failure is recorded with: a count, naming
    nothing of the checks (the next attempt is told it; the evidence, for
    operators, has everything)."""
    return HELD_OUT_FAILED.format(n=max(failed, 1))


def _place_held_out(checkout: Path, acceptance: Acceptance) -> Path | None:
    """Make ``held_out`` in the checkout an empty directory of the verifier's
    (whatever a run before left there removed, no link on the way), and
    copy the held-out files in when there is no cell; returns the directory."""
    if acceptance.held_out is None or acceptance.held_out_source is None:
        return None
    target = checkout
    for part in Path(acceptance.held_out).parts:
        target = target / part
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            target.unlink()
    if target.exists():
        shutil.rmtree(target)
    if acceptance.sandboxed:
        target.mkdir(parents=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(acceptance.held_out_source, target, symlinks=False)
    return target


async def run_acceptance(
    checkout: Path,
    acceptance: Acceptance,
    prepare: Callable[[int, tuple[str, ...], Where], Sequence[str]] | None = None,
    annotate: Callable[[int, CommandResult], CommandResult] | None = None,
    bindings: Sequence[Binding] = (),
    judge: Path | None = None,
) -> tuple[list[CommandResult], list[list[str]]]:
    """Run the commands in order within the one time budget, stopping at the
    first that fails. Each runs in a cell of its own with a face of its own
    (``where_for``); ``prepare(i, argv, where)`` may rewrite a command
    before it runs, ``annotate(i, result)`` may add to its result (an
    ``extra["refused"]`` reason fails a command that exited 0); ``bindings``
    are more host paths the cells see, ``judge`` a directory each sees
    read-only at ``where.judge``. The held-out acceptance is in the checkout
    for its own commands only: read-only, in a cell. Returns the results and
    the commands that were not run."""
    deadline = time.monotonic() + acceptance.timeout_s
    results: list[CommandResult] = []
    for i, argv in enumerate(acceptance.commands):
        where = where_for(checkout, acceptance, judge)
        cell: CellSpec | None = None
        held = await asyncio.to_thread(_place_held_out, checkout, acceptance) if acceptance.is_held_out(i) \
            else None
        if acceptance.sandboxed:
            seen = [Binding(checkout, where.checkout, writable=True)]
            if acceptance.outputs is not None and where.outputs is not None:
                seen.append(Binding(acceptance.outputs, where.outputs, writable=True))
            if judge is not None:
                seen.append(Binding(judge, where.judge, writable=False))
            if held is not None and acceptance.held_out_source is not None:
                seen.append(Binding(acceptance.held_out_source, f"{where.checkout}/{acceptance.held_out}",
                                    writable=False))
            cell = CellSpec(acceptance.cell, (*seen, *bindings), cwd=where.checkout,
                            env=cell_environment(acceptance.environment), guise=where.guise)
        command = list(prepare(i, argv, where)) if prepare else list(argv)
        result = await run_command(command, checkout, timeout_s=deadline - time.monotonic(),
                                   env=child_environment(acceptance.environment), cell=cell)
        if annotate:
            result = annotate(i, result)
        results.append(result)
        if not passed(result):
            skipped = [list(a) for a in acceptance.commands[i + 1:]]
            return results, skipped
    return results, []


def passed(result: CommandResult) -> bool:
    """Whether a command passed: exit 0 in time, and nothing refused it."""
    return result.passed and not result.extra.get("refused")


def names() -> list[str]:
    """Every implementation name available in this environment."""
    return sorted(set(BUILTINS) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def load(name: str) -> Implementation:
    """The implementation called ``name``: a built-in, else an entry point of
    group ``ledger.verifiers``. ``UnknownVerifier`` if there is none."""
    if name in BUILTINS:
        # A third-party entry point may not take over a built-in name: which
        # code judges "command" must not depend on what else is installed.
        target: Any = _resolve(BUILTINS[name])
    else:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not found:
            raise UnknownVerifier(f"no verifier implementation named {name!r} is installed "
                                  f"(available: {', '.join(names())})")
        target = found[0].load()
    implementation = target() if isinstance(target, type) or not hasattr(target, "verify") else target
    if not isinstance(implementation, Implementation):
        raise UnknownVerifier(f"{name!r} does not provide a verifier implementation "
                              f"(a name and an async verify method)")
    return implementation


def _resolve(reference: str) -> Any:
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


__all__ = [
    "Acceptance", "Baseline", "CommandResult", "ENTRY_POINT_GROUP", "Implementation", "InvalidAcceptance",
    "UnknownVerifier", "Verdict", "Where", "held_out_reason", "load", "names", "passed", "run_acceptance",
    "run_command", "where_for",
]
