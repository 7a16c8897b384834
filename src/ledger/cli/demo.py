"""``ledger demo``."""

from __future__ import annotations

import typer

from ..demo import run_demo
from .context import console, run, state


def register(app: typer.Typer) -> None:
    """Add the demo command to ``app``."""
    app.command("demo")(demo)


def demo(ctx: typer.Context) -> None:
    """The closed loop in one command: a broken repository, a sensor that notices,
    a worker whose first fix is wrong, an independent verifier, a promotion read
    back, and the next scheduled observation confirming -- narrated as it happens."""
    raise typer.Exit(run(run_demo(state(ctx).settings, console)))
