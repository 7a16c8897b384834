"""``ledger migrate`` and ``ledger graph``."""

from __future__ import annotations

from pathlib import Path

import typer

from .. import migrations
from ..reads import Reads
from ..machine import StateMachine
from .context import console_err, run, state


def register(app: typer.Typer) -> None:
    """Add the schema commands to ``app``."""
    app.command("migrate")(migrate)
    app.command("graph")(graph)


def migrate(
    ctx: typer.Context,
    to: str = typer.Option("head", "--to", help="Target revision."),
    downgrade: bool = typer.Option(False, "--downgrade",
                                   help="Go down to --to (e.g. base) instead of up."),
) -> None:
    """Create or update Ledger's schema and roles (idempotent; safe to run concurrently)."""
    st = state(ctx)
    db = st.database()
    before = migrations.current(db.url)
    if downgrade:
        migrations.downgrade(db.url, st.settings.role_prefix, to)
    else:
        migrations.upgrade(db.url, st.settings.role_prefix, to)
    after = migrations.current(db.url)
    if before == after:
        console_err.print(f"schema already at {after or 'base'}")
    else:
        console_err.print(f"schema migrated: {before or 'base'} -> {after or 'base'}")


def graph(
    ctx: typer.Context,
    output: Path = typer.Option(Path("ledger-states.svg"), "-o", "--output",
                                help="File to write; '-' for stdout."),
    fmt: str = typer.Option("svg", "--format", help="svg or mermaid."),
) -> None:
    """Draw the state machine from the database's transition table."""
    if fmt not in ("svg", "mermaid"):
        raise typer.BadParameter("--format must be svg or mermaid")

    async def load() -> StateMachine:
        async with state(ctx).database().session("reader") as session:
            return await StateMachine.load(Reads(session))

    machine = run(load())
    text = machine.svg() if fmt == "svg" else machine.mermaid()
    if str(output) == "-":
        typer.echo(text, nl=False)
    else:
        output.write_text(text)
        console_err.print(f"wrote {output}")
