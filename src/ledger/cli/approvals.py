"""Commands on approvals (docs/approval.md): list what waits, approve, deny.

A decision is the operator role's (the database refuses any other) and is
journaled with who made it (``cli:<user>@<host>``) and why; the identity that
made the attempt may not decide it.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import typer

from ledger.cli.context import console, console_err, emit_json, iso_z, run, state
from ledger.cli.knobs import option
from ledger.cli.output import table
from ledger.errors import InvalidInput, LedgerError, OutcomeUnknown, Unavailable

if TYPE_CHECKING:
    from ledger.db.kernel import Kernel
    from ledger.db.models import ApprovalDecision, WaitingApproval

JSON_OPTION = option("json")


def register(app: typer.Typer) -> None:
    """Add the approval commands to ``app``."""
    app.command("approvals")(approvals)
    app.command("approve")(approve)
    app.command("deny")(deny)


def approvals(
    ctx: typer.Context,
    class_: str | None = option("approvals_class"),
    limit: int = option("approvals_limit"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Candidates that wait for a person, oldest first: which conditions asked,
    and when the class's timeout decides."""
    from ledger.db.reads import Reads

    async def go() -> list[WaitingApproval]:
        async with state(ctx).database().session("reader") as s:
            return await Reads(s).approvals_waiting(class_, limit)
    rows = run(go())
    if as_json:
        emit_json(rows)
        return
    now = datetime.now(timezone.utc)
    t = table("campaign", "class", "objective", "waiting", "asked because", "decides", "at")
    for a in rows:
        waited = f"{(now - a.requested_at).total_seconds():.0f}s"
        t.add_row(str(a.campaign_id), a.class_, a.objective_key, waited,
                  "; ".join(r.detail for r in a.reasons),
                  a.on_timeout if a.deadline else "a person",
                  iso_z(a.deadline) if a.deadline else "-")
    t.print()
    console_err.print(f"{len(rows)} waiting", highlight=False)


def _decide(ctx: typer.Context, campaign_ids: list[int], as_json: bool,
            act: Callable[[Kernel, int], Awaitable[ApprovalDecision]]) -> None:
    """Decide each campaign (as the operator) even if some fail; one result
    per id; exit with the first failure's code."""
    from ledger.db.kernel import Kernel

    results: list[object] = []
    first_failure: LedgerError | None = None

    async def go() -> None:
        nonlocal first_failure
        async with state(ctx).database().session("operator") as s:
            kernel = Kernel(s)
            for cid in campaign_ids:
                try:
                    decided = await act(kernel, cid)
                except LedgerError as exc:
                    if isinstance(exc, Unavailable) and not isinstance(exc, OutcomeUnknown):
                        raise  # not about this campaign: the database cannot be used
                    first_failure = first_failure or exc
                    results.append({"campaign_id": cid, "outcome": exc.slug, "error": exc.message})
                    console_err.print(f"ledger: campaign {cid}: {exc.message}",
                                      markup=False, highlight=False, soft_wrap=True)
                    continue
                results.append({"campaign_id": cid, **decided.model_dump(mode="json")})
                if not as_json:
                    then = (f"its promotion is intent {decided.side_effect_id}"
                            if decided.side_effect_id else f"now {decided.state}")
                    console.print(f"campaign {cid} {decided.decision} (approval {decided.approval_id}): {then}")
    run(go())
    if as_json:
        emit_json(results)
    if first_failure is not None:
        sys.exit(first_failure.exit_code)


def approve(
    ctx: typer.Context,
    campaign_ids: list[int] = typer.Argument(..., help="Campaign ids (each awaiting approval)."),
    reason: str | None = option("approve_reason"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Approve candidates that await approval: each one's promotion is queued."""
    from ledger.cli.campaigns import operator_identity

    _decide(ctx, campaign_ids, as_json,
            lambda kernel, cid: kernel.approve(cid, operator_identity(), reason))


def deny(
    ctx: typer.Context,
    campaign_ids: list[int] = typer.Argument(..., help="Campaign ids (each awaiting approval)."),
    reason: str | None = option("deny_reason"),
    abandon: bool = option("deny_abandon"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Deny candidates that await approval: back to ready, the reason told to the
    next attempt as a rejection (or, with --abandon, abandoned)."""
    from ledger.cli.campaigns import operator_identity

    if not reason or not reason.strip():
        raise InvalidInput("deny needs --reason: the next attempt is told why")
    _decide(ctx, campaign_ids, as_json,
            lambda kernel, cid: kernel.deny(cid, operator_identity(), reason, abandon=abandon))
