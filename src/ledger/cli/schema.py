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
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="List the revisions an upgrade would apply and the SQL "
                                      "each would run; change nothing."),
    create_database: bool = option("create_database"),
    lock_timeout_s: float = option("migrate_lock_timeout_s"),
    lock_retries: int = option("migrate_lock_retries"),
) -> None:
    """Create or update Ledger's schema and roles (idempotent; safe to run
    concurrently). Each revision runs in a transaction of its own: one that
    fails, or cannot get its locks within --lock-timeout after --lock-retries
    tries, is rolled back and the database stays at the revision before it.
    Processes of the previous release keep working meanwhile
    (docs/upgrading.md)."""
    import time

    from ledger.db import migrations
    from ledger.db.readiness import connection_problem, create_missing_database, database_name
    from ledger.release import describe

    st = state(ctx)
    db = st.database()
    if create_database and not dry_run:
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
    if dry_run:
        plan = migrations.pending(db.url, to)
        if not plan:
            console_err.print(f"schema already at {describe(before)}: nothing to apply", highlight=False)
            return
        console_err.print(f"at {describe(before)}; an upgrade would apply {len(plan)} revision(s), "
                          "each in a transaction of its own:", highlight=False)
        for item in plan:
            console_err.print(f"  {item.revision}: {item.doc.splitlines()[0] if item.doc else ''}",
                              highlight=False)
        for item in plan:
            typer.echo(f"-- ===== {item.revision}\n{item.sql}")
        return
    started: dict[str, float] = {}

    def progress(revision: str, what: str) -> None:
        if what in ("applying", "undoing"):
            started[revision] = time.monotonic()
            console_err.print(f"{what} {revision} ...", highlight=False)
        elif what == "done":
            took = time.monotonic() - started.get(revision, time.monotonic())
            console_err.print(f"  {revision} done in {took:.2f}s", highlight=False)
        else:
            console_err.print(f"  {revision} {what}", highlight=False)

    if downgrade:
        migrations.downgrade(db.url, st.settings.role_prefix, to)
    else:
        migrations.upgrade(db.url, st.settings.role_prefix, to, lock_timeout_s=lock_timeout_s,
                           lock_retries=lock_retries, progress=progress)
    after = migrations.current(db.url)
    if before == after:
        console_err.print(f"schema already at {describe(after)}", highlight=False)
    else:
        console_err.print(f"schema migrated: {describe(before)} -> {describe(after)}",
                          highlight=False)


def graph(
    ctx: typer.Context,
    output: Path = typer.Option(Path("ledger-states.svg"), "-o", "--output",
                                help="File to write; '-' for stdout."),
    fmt: str = typer.Option("svg", "--format", help="svg or mermaid."),
) -> None:
    """Draw the state machine from the database's transition table."""
    if fmt not in ("svg", "mermaid"):
        raise typer.BadParameter("--format must be svg or mermaid")
    from ledger.db.reads import Reads
    from ledger.machine import StateMachine

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
