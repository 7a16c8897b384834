"""``ledger drill``: prove the failure paths on your own deployment."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from ..drill import DrillReport, load_drills, run_drill, write_report
from ..errors import ConfigError
from .context import console, run, state


def register(app: typer.Typer) -> None:
    """Add ``ledger drill`` to ``app``."""
    app.command("drill")(drill)


def drill(
    ctx: typer.Context,
    names: list[str] = typer.Argument(..., help="'list', 'all', or drill names."),
    report: Path | None = typer.Option(None, "--report", envvar="LEDGER_DRILL_REPORT", show_envvar=True,
                                help="Write a JSON report here."),
    database_url: str | None = typer.Option(None, "--database-url", envvar="LEDGER_DATABASE_URL", show_envvar=True,
                                     help="Administrator URL of the server to drill (a throwaway database "
                                          "is created per drill). Unset: a throwaway embedded cluster."),
    scale: float = typer.Option(1.0, "--scale", min=0.01, max=10, envvar="LEDGER_DRILL_SCALE",
                                show_envvar=True, help="Size of the load drill (CI runs it at 0.1)."),
    keep: bool = typer.Option(False, "--keep", help="Keep each drill's workspace (logs) for inspection."),
) -> None:
    """Run fault-injection drills with real processes and signals; each prints a
    timeline and a verdict. Exit 0 only if every drill passed (1: a failure,
    3: under-exercised)."""
    drills = load_drills()
    if names == ["list"]:
        table = Table("drill", "setup -> fault -> what must hold")
        for name, d in drills.items():
            table.add_row(name, d.summary)
        console.print(table)
        return
    chosen = list(drills) if names == ["all"] else names
    unknown = [n for n in chosen if n not in drills]
    if unknown:
        raise ConfigError(f"unknown drill(s): {', '.join(unknown)} (see: ledger drill list)")
    settings = state(ctx).settings
    admin_url = database_url or settings.database_url

    async def go() -> list[DrillReport]:
        return [await run_drill(drills[n], admin_url=admin_url, role_prefix=settings.role_prefix,
                                console=console, scale=scale, keep=keep) for n in chosen]

    reports = run(go())
    if report:
        write_report(report, reports)
    table = Table("drill", "verdict", "seconds")
    for r in reports:
        table.add_row(r.name, r.verdict, f"{r.duration_s:.1f}")
    console.print(table)
    verdicts = {r.verdict for r in reports}
    raise typer.Exit(1 if "fail" in verdicts else 3 if "under-exercised" in verdicts else 0)
