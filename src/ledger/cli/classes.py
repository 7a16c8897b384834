"""``ledger classes``: register the classes of ledger.toml in the database, list
them, pause and resume one."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ledger.cli.context import console_err, emit_json, run, state
from ledger.cli.output import table
from ledger.cli.runtime import CONFIG_OPTION, config_path

if TYPE_CHECKING:
    from ledger.db.models import CampaignClass, ClassPause

classes_app = typer.Typer(help="Campaign classes: what the kernel knows of them.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``ledger classes ...`` to ``app``."""
    app.add_typer(classes_app, name="classes")


@classes_app.command("sync")
def sync(ctx: typer.Context, config: Path = CONFIG_OPTION) -> None:
    """Register (or update) every class of the config file, as the operator role,
    after checking every class's repository and base_ref and every sensor's
    observed ref: a misconfiguration registers nothing (exit 78); a remote
    out of reach now is a warning."""
    from ledger.cli.campaigns import operator_identity
    from ledger.cli.runtime import preflight
    from ledger.config import load_config
    from ledger.db.kernel import Kernel

    cfg = load_config(config_path(ctx, config))
    # Every repository and ref checked before anything is registered.
    preflight(cfg, config_path(ctx, config), refused="no class was registered")

    async def go() -> None:
        async with state(ctx).database().session("operator") as s:
            kernel = Kernel(s)
            for name, cls in sorted(cfg.classes.items()):
                await kernel.register_class(name, **cls.registration())
                console_err.print(f"registered class {name}")
            # limits (docs/limits.md): buckets, keys' caps, each class's keys and budget
            await cfg.sync_limits(kernel, operator=operator_identity())
            if cfg.limits or cfg.keys or any(c.limit_keys or c.uses or c.max_cost for c in cfg.classes.values()):
                console_err.print(f"set limits: {len(cfg.limits)} resource(s), "
                                  f"{len(cfg.key_limits())} key(s)")

    run(go())


@classes_app.command("list")
def list_(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The classes registered in the database."""
    from ledger.db.reads import Reads

    async def go() -> list[CampaignClass]:
        async with state(ctx).database().session("reader") as s:
            return await Reads(s).classes()

    rows = run(go())
    if as_json:
        emit_json(rows)
        return
    t = table("class", "max attempts", "lease s", "seat", "verifier", "promotes to", "paused since")
    for c in rows:
        t.add_row(c.name, str(c.max_attempts), f"{c.lease_seconds:g}", c.seat_policy, c.verifier,
                  c.promotion.get("ref", "-"),
                  c.paused_at.isoformat(timespec="seconds") if c.paused_at else "-")
    t.print()


NAME_ARGUMENT = typer.Argument(..., help="The class's name.")


@classes_app.command("pause")
def pause(ctx: typer.Context, name: str = NAME_ARGUMENT,
          reason: str | None = typer.Option(None, "--reason", help="Why (kept in the class's journal)."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Pause a class: workers claim none of its campaigns; attempts in flight
    finish (journaled with your identity). Exit 6 if it is not registered."""
    from ledger.cli.campaigns import operator_identity
    from ledger.db.kernel import Kernel

    if reason is not None and len(reason) > 1000:
        raise typer.BadParameter("at most 1000 characters", param_hint="--reason")

    async def go() -> ClassPause:
        async with state(ctx).database().session("operator") as s:
            return await Kernel(s).pause_class(name, reason, operator_identity())

    done = run(go())
    if as_json:
        emit_json(done)
    elif done.changed:
        console_err.print(f"paused class {name}: no new claims; attempts in flight finish")
    else:
        console_err.print(f"class {name} was paused already (since "
                          f"{done.paused_at.isoformat(timespec='seconds') if done.paused_at else '?'})")


@classes_app.command("resume")
def resume(ctx: typer.Context, name: str = NAME_ARGUMENT,
           as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Resume a paused class: its campaigns are claimed again."""
    from ledger.cli.campaigns import operator_identity
    from ledger.db.kernel import Kernel

    async def go() -> ClassPause:
        async with state(ctx).database().session("operator") as s:
            return await Kernel(s).resume_class(name, operator_identity())

    done = run(go())
    if as_json:
        emit_json(done)
    elif done.changed:
        console_err.print(f"resumed class {name}: its campaigns are claimed again")
    else:
        console_err.print(f"class {name} was not paused")
