"""``ledger classes``: register the classes of ledger.toml in the database."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .context import console_err, emit_json, run, state
from .output import table
from .runtime import CONFIG_OPTION, config_path

if TYPE_CHECKING:
    from ..models import CampaignClass

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
    from ..config import load_config
    from ..kernel import Kernel
    from .runtime import preflight

    cfg = load_config(config_path(ctx, config))
    # Every repository and ref checked before anything is registered.
    preflight(cfg, config_path(ctx, config), refused="no class was registered")

    async def go() -> None:
        async with state(ctx).database().session("operator") as s:
            kernel = Kernel(s)
            for name, cls in sorted(cfg.classes.items()):
                await kernel.register_class(name, **cls.registration())
                console_err.print(f"registered class {name}")

    run(go())


@classes_app.command("list")
def list_(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """The classes registered in the database."""
    from ..reads import Reads

    async def go() -> list[CampaignClass]:
        async with state(ctx).database().session("reader") as s:
            return await Reads(s).classes()

    rows = run(go())
    if as_json:
        emit_json(rows)
        return
    t = table("class", "max attempts", "lease s", "seat", "verifier", "promotes to")
    for c in rows:
        t.add_row(c.name, str(c.max_attempts), f"{c.lease_seconds:g}", c.seat_policy, c.verifier,
                  c.promotion.get("ref", "-"))
    t.print()
