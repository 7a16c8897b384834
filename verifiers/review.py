"""The ``review`` verifier: a second opinion, from a command the class names
(``acceptance.review``) -- the place to plug in another model family, a
linter, a human's queue.

The design at length: docs/internals.md (``ledger.verifiers.review``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ledger.sandbox.cell import INSIDE_WORK, Binding, CellPolicy, CellSpec
from ledger.sandbox.processes import cell_environment, check_extra, child_environment, run_command

from . import Acceptance, InvalidAcceptance, Verdict

_OUTPUT_LIMIT = 64 * 1024


class ReviewVerifier:
    """Run the class's reviewer command; its JSON verdict is the verdict."""

    name = "review"

    async def verify(self, checkout: Path, acceptance: Acceptance) -> Verdict:
        """Ask the reviewer about the candidate checked out at ``checkout``."""
        spec = acceptance.review
        command = spec.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
            raise InvalidAcceptance("the review verifier needs acceptance.review.command (an argv list)")
        timeout = float(spec.get("timeout_s") or 600.0)
        extras = [check_extra(str(e)) for e in spec.get("environment") or []]
        policy = CellPolicy.model_validate(spec.get("cell") or {})
        stdin = json.dumps(dict(acceptance.context), default=str).encode()
        cell = None
        if policy.sandbox:
            cell = CellSpec(policy, (Binding(checkout, INSIDE_WORK, writable=False),), cwd=INSIDE_WORK,
                            env=cell_environment(extras))
        result = await run_command(command, checkout, timeout_s=timeout, env=child_environment(extras),
                                   stdin=stdin, tail_bytes=_OUTPUT_LIMIT, cell=cell)
        evidence: dict[str, Any] = {"review": result.evidence()}
        if not result.passed:
            return Verdict(accepted=False, reason=f"the reviewer did not give a verdict: {result.describe()}",
                           evidence=evidence)
        answer = _answer(result.output)
        if answer is None:
            return Verdict(accepted=False, evidence=evidence,
                           reason="the reviewer's output is not a JSON verdict "
                                  '({"verdict": "accept", "reject" or "needs_human", ...})')
        evidence["review_verdict"] = answer
        if answer.get("verdict") == "needs_human":
            why = str(answer.get("summary") or answer.get("reason") or "the reviewer cannot decide")[:500]
            evidence["summary"] = f"the reviewer asks for a person: {why}"
            evidence["needs_human"] = why
            return Verdict(accepted=True, evidence=evidence)
        if answer.get("verdict") == "accept":
            evidence["summary"] = str(answer.get("summary") or "the reviewer accepted")[:500]
            return Verdict(accepted=True, evidence=evidence)
        reason = str(answer.get("reason") or answer.get("summary") or "no reason given")[:2000]
        return Verdict(accepted=False, reason=f"the reviewer rejected it: {reason}", evidence=evidence)


def _answer(output: str) -> dict[str, Any] | None:
    """The last line of ``output`` that is a JSON verdict object."""
    for line in reversed(output.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and value.get("verdict") in ("accept", "reject", "needs_human"):
            return value
    return None
