"""``ledger demo``."""

from __future__ import annotations

import typer

from ..demo import run_demo
from .context import console, run, state


def register(app: typer.Typer) -> None:
    """Add the demo command to ``app``."""
    app.command("demo")(demo)


def demo(ctx: typer.Context) -> None:
    """Run one campaign through Ledger on the embedded PostgreSQL and narrate it."""
    raise typer.Exit(run(run_demo(state(ctx).settings, console)))
