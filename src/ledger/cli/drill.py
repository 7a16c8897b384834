"""``ledger drill``: prove the failure paths on your own deployment."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ledger.cli.context import console, console_err, emit_json, run, state
from ledger.cli.knobs import option
from ledger.cli.output import table
from ledger.errors import ConfigError

if TYPE_CHECKING:
    from ledger.ops.drill import DrillReport


def register(app: typer.Typer) -> None:
    """Add ``ledger drill`` to ``app``."""
    app.command("drill")(drill)


def drill(
    ctx: typer.Context,
    names: list[str] = typer.Argument(..., help="'list', 'all', or drill names."),
    report: Path | None = option("drill_report"),
    database_url: str | None = option("database_url"),
    scale: float = option("drill_scale"),
    keep: bool = typer.Option(False, "--keep", help="Keep each drill's workspace (logs) for inspection."),
    minutes: float = option("drill_minutes"),
    as_json: bool = option("json"),
) -> None:
    """Run fault-injection drills with real processes and signals; each prints a
    timeline and a verdict. Exit 0 only if every drill passed (1: a failure,
    3: under-exercised)."""
    from ledger.ops.drill import load_drills, run_drill, write_report

    drills = load_drills()
    if names == ["list"]:
        if as_json:
            emit_json([{"drill": name, "summary": d.summary} for name, d in drills.items()])
            return
        listing = table("drill", "setup -> fault -> what must hold")
        for name, d in drills.items():
            listing.add_row(name, d.summary)
        listing.print()
        return
    chosen = list(drills) if names == ["all"] else names
    unknown = [n for n in chosen if n not in drills]
    if unknown:
        raise ConfigError(f"unknown drill(s): {', '.join(unknown)} (see: ledger drill list)")
    settings = state(ctx).settings
    admin_url = database_url or settings.database_url
    if database_url:
        from ledger.settings import check_database_url

        try:
            check_database_url(database_url)
        except ValueError as exc:
            raise ConfigError(f"--database-url / LEDGER_DATABASE_URL: {exc}") from None
    if admin_url:
        # Each drill makes its own database there: a server that cannot be used
        # is the user's to fix, not a drill's verdict.
        import psycopg

        from ledger.db.readiness import connection_problem

        try:
            psycopg.connect(admin_url, connect_timeout=5).close()
        except psycopg.Error as exc:
            raise connection_problem(admin_url, exc) from None

    async def go() -> list[DrillReport]:
        return [await run_drill(drills[n], admin_url=admin_url, role_prefix=settings.role_prefix,
                                console=console_err if as_json else console, scale=scale,
                                keep=keep, minutes=minutes) for n in chosen]

    reports = run(go())
    if report:
        write_report(report, reports)
    if as_json:
        from dataclasses import asdict

        emit_json({"drills": [asdict(r) for r in reports],
                   "verdicts": {r.name: r.verdict for r in reports}})
    else:
        verdicts_table = table("drill", "verdict", "seconds")
        for r in reports:
            verdicts_table.add_row(r.name, r.verdict, f"{r.duration_s:.1f}")
        verdicts_table.print()
    verdicts = {r.verdict for r in reports}
    raise typer.Exit(1 if "fail" in verdicts else 3 if "under-exercised" in verdicts else 0)
