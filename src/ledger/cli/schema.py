"""``ledger migrate`` and ``ledger graph``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ledger.cli.context import console_err, run, state
from ledger.cli.knobs import option

if TYPE_CHECKING:
    from ledger.machine import StateMachine


def register(app: typer.Typer) -> None:
    """Add the schema commands to ``app``."""
    app.command("migrate")(migrate)
    app.command("graph")(graph)


def migrate(
    ctx: typer.Context,
    to: str = typer.Option("head", "--to", help="Target revision."),
    downgrade: bool = typer.Option(False, "--downgrade",
                                   help="Go down to --to (e.g. base) instead of up."),
    create_database: bool = option("create_database"),
) -> None:
    """Create or update Ledger's schema and roles (idempotent; safe to run concurrently)."""
    from ledger.db import migrations
    from ledger.cli.readiness import connection_problem, create_missing_database, database_name

    st = state(ctx)
    db = st.database()
    if create_database:
        if create_missing_database(db.url):
            console_err.print(f"created database {database_name(db.url)}", highlight=False)
    else:
        import psycopg

        try:
            psycopg.connect(db.url, connect_timeout=5).close()
        except psycopg.Error as exc:
            # one line saying what is wrong (missing database or no server)
            raise connection_problem(db.url, exc) from None
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
    from ledger.machine import StateMachine
    from ledger.db.reads import Reads

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
