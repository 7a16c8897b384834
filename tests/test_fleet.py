"""A fleet across machines (docs: Deployment, "Several machines"): the ``machines`` drill run as a test
over each transport -- a worker, a verifier, a dispatcher and a sensor, each a
``ledger`` process with its own data dir, home and temporary directory (in a
network namespace of its own where this host can make one), sharing nothing
but PostgreSQL and a git remote served on loopback: ``git daemon``
(``git://``) and git's ``http-backend`` behind basic authentication.

A regression pushed to the remote is opened, fixed, verified, promoted onto
the remote and confirmed (findings 1-3: the candidate leaves the worker's
machine, the evidence is in the database, the promotion reaches the remote);
then the remote goes down while the candidate awaits its verdict and the
campaign waits, charged nothing, and closes when it returns."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from ledger import Database
from ledger.ops.drill import DrillContext

pytestmark = [pytest.mark.anyio, pytest.mark.cells]


@pytest.mark.parametrize("transport", ["git", "http"])
async def test_a_fleet_across_machines_closes_a_regression_and_survives_the_remotes_outage(
        db: Database, tmp_path: Path, transport: str) -> None:
    from ledger.drills.machines import Machines

    drill = Machines(transports=(transport,))
    ctx = DrillContext(drill, db, tmp_path, Console(quiet=True), 1.0)
    try:
        await drill.run(ctx)
    finally:
        await ctx.close()
    failed = [f"{e.what} ({e.detail})" for e in ctx.expectations if not e.held]
    assert not failed, "\n".join(failed) + "\n" + "\n".join(
        f"{s['t']:7.2f} {s['step']}" for s in ctx.timeline)
    assert len(ctx.expectations) >= 14, [e.what for e in ctx.expectations]
    for e in ctx.expectations:
        print(("ok  " if e.held else "FAIL"), e.what, "--", e.detail)
    [measured] = drill.rounds
    print(f"\n{transport} on {drill.isolation}: break -> confirmed {measured.break_to_confirmed_s}s; "
          f"with the outage {measured.outage_break_to_confirmed_s}s (remote back -> confirmed "
          f"{measured.back_to_confirmed_s}s)")
