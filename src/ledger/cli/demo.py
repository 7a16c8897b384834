"""``ledger demo``."""

from __future__ import annotations

import typer

from ledger.cli.context import console, run, state
from ledger.cli.knobs import option


def register(app: typer.Typer) -> None:
    """Add the demo command to ``app``."""
    app.command("demo")(demo)


def demo(
    ctx: typer.Context,
    ui: bool = option("demo_ui"),
    ui_port: int = option("demo_ui_port"),
    require_sandbox: bool = option("demo_require_sandbox"),
) -> None:
    """The closed loop in one command: a broken repository, a sensor that notices,
    a worker whose first fix is wrong, an independent verifier, a promotion read
    back, and the next scheduled observation confirming -- narrated as it happens.
    Where no cell can be built (no bubblewrap), the demo's own scripted agent and
    checks run outside one, saying so; --require-sandbox refuses instead."""
    from ledger.demo import run_demo

    raise typer.Exit(run(run_demo(state(ctx).settings, console,
                                  ui_port=ui_port if ui else None,
                                  require_sandbox=require_sandbox)))
