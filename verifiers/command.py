"""The ``command`` verifier: the candidate passes when every acceptance command
exits 0 within the acceptance timeout."""

from __future__ import annotations

from pathlib import Path

from . import Acceptance, Verdict, held_out_reason, run_acceptance


class CommandVerifier:
    """Run each acceptance command in order; all exit 0 -> accept."""

    name = "command"

    async def verify(self, checkout: Path, acceptance: Acceptance) -> Verdict:
        """Run the commands in ``checkout``; reject at the first that fails."""
        results, skipped = await run_acceptance(checkout, acceptance)
        evidence = {"commands": [r.evidence() for r in results], "not_run": skipped}
        failed_at = next((i for i, r in enumerate(results) if not r.passed), None)
        if failed_at is None:
            evidence["summary"] = f"{len(results)} acceptance command(s) passed"
            return Verdict(accepted=True, evidence=evidence)
        failed = results[failed_at]
        if acceptance.is_held_out(failed_at):  # named for operators only (the evidence)
            evidence["held_out"] = {"into": acceptance.held_out, "reason": failed.describe()}
            return Verdict(accepted=False, reason=held_out_reason(1), evidence=evidence)
        return Verdict(accepted=False, reason=failed.describe(), evidence=evidence)
