"""``ledger demo``."""

from __future__ import annotations

import typer

from .context import console, run, state


def register(app: typer.Typer) -> None:
    """Add the demo command to ``app``."""
    app.command("demo")(demo)


def demo(
    ctx: typer.Context,
    ui: bool = typer.Option(False, "--ui", envvar="LEDGER_DEMO_UI", show_envvar=True,
                            help="Also serve the dashboard (prints its URL and a token), "
                                 "and keep serving it after the loop closes, until Ctrl-C."),
    ui_port: int = typer.Option(0, "--ui-port", min=0, max=65535, envvar="LEDGER_DEMO_UI_PORT",
                                show_envvar=True, help="The dashboard's port (0: any free one)."),
) -> None:
    """The closed loop in one command: a broken repository, a sensor that notices,
    a worker whose first fix is wrong, an independent verifier, a promotion read
    back, and the next scheduled observation confirming -- narrated as it happens."""
    from ..demo import run_demo

    raise typer.Exit(run(run_demo(state(ctx).settings, console,
                                  ui_port=ui_port if ui else None)))
