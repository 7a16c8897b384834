"""``ledger gc``: remove attempt branches of closed campaigns past their retention."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ledger.cli.context import console_err, emit_json, run, state
from ledger.cli.runtime import CONFIG_OPTION, LOG_OPTION, config_path
from ledger.runtime.commands import service_command

if TYPE_CHECKING:
    from ledger.roles.gc import Collected


def register(app: typer.Typer) -> None:
    """Add the gc command to ``app``."""
    app.command("gc")(gc)


@service_command(when="every")
def gc(
    ctx: typer.Context,
    config: Path = CONFIG_OPTION,
    class_: list[str] = typer.Option([], "--class", help="Only these classes' repositories "
                                                         "(repeatable; default: all)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would go; delete nothing."),
    every: float | None = typer.Option(None, "--every", min=1.0,
                                help="Keep running: a pass every this many seconds, until SIGTERM."),
    as_json: bool = typer.Option(False, "--json", help="Print what the pass did as JSON."),
    log_level: str = LOG_OPTION,
) -> None:
    """Delete the attempt branches (ledger/<campaign>/<attempt>) of campaigns closed
    longer ago than their class's branch_retention_s, prune stale worktrees and
    sweep the work directories of dead workers. Open and exhausted campaigns keep
    their branches; each attempt's evidence bundle keeps its candidate's SHA, diff
    and digest either way."""
    from ledger import logs
    from ledger.config import load_config
    from ledger.db.reads import Reads
    from ledger.roles.gc import Collector, collect

    logs.configure(log_level)
    st = state(ctx)
    cfg = load_config(config_path(ctx, config))
    for name in class_:
        cfg.campaign_class(name)
    if every is not None and dry_run:
        raise typer.BadParameter("--dry-run is for one pass; drop --every")

    async def go() -> Collected | None:
        # Checked up front: with no attempt branches to look at, a pass would
        # never touch the database and report success on one never migrated.
        async with st.database(ready=True).session("reader") as session:
            reads = Reads(session)
            if every is None:
                return await collect(reads, cfg, st.settings.data_dir, classes=class_,
                                     dry_run=dry_run)
            collector = Collector(reads, cfg, st.settings.data_dir, interval_s=every,
                                  classes=class_)
            from ledger.runtime.host import serve

            code = await serve([collector], name="gc")
            if code:
                raise typer.Exit(code)
            return collector.last

    done = run(go())
    if done is None:
        return
    if as_json:
        emit_json(dataclasses.asdict(done) | {"dry_run": dry_run})
        return
    verb = "would delete" if dry_run else "deleted"
    for line in done.deleted:
        console_err.print(f"{verb} {line}", highlight=False, soft_wrap=True)
    console_err.print(
        f"gc: {verb} {len(done.deleted)} branch(es); kept {done.kept_open} of open campaigns, "
        f"{done.kept_recent} within retention, {done.kept_unknown} of unknown campaigns, "
        f"{done.kept_moved} moved since listed; pruned {done.pruned_worktrees} worktree(s), "
        f"swept {done.swept_workdirs} stale work dir(s)", highlight=False, soft_wrap=True)
    for error in done.errors:
        console_err.print(f"[red]gc:[/] {error}", highlight=False, soft_wrap=True)
    if done.errors:
        raise typer.Exit(12)
