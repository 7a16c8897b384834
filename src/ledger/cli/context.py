"""What every command shares: settings, the database, the event loop, output."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console

from ..database import Database
from ..settings import Settings

T = TypeVar("T")

console = Console()  # data (stdout); rich honours NO_COLOR and plain pipes
console_err = Console(stderr=True)  # messages


@dataclass
class State:
    """Per-invocation state built from the global options."""

    settings: Settings

    @classmethod
    def from_options(cls, **options: Any) -> State:
        overrides = {k: v for k, v in options.items() if v is not None}
        if "data_dir" in overrides:
            overrides["data_dir"] = Path(overrides["data_dir"])
        return cls(Settings(**overrides))

    def database(self, *, wait_s: float | None = None) -> Database:
        """The database to use (starting the embedded server if none is
        configured); a service (which says how long it waits for the database
        at start-up: ``wait_s``) also warns when it holds administrator rights."""
        db = Database.from_settings(self.settings)
        db.wait_for_database_s = wait_s or 0.0
        db.service = wait_s is not None
        return db


def state(ctx: typer.Context) -> State:
    """The invocation's state (from the root command's callback)."""
    return ctx.find_root().obj  # type: ignore[no-any-return]


def run(coro: Awaitable[T]) -> T:
    """Run a coroutine to completion (commands are thin sync shells)."""
    return asyncio.run(coro)  # type: ignore[arg-type]


def emit_json(value: Any) -> None:
    """Machine-readable output on stdout."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True)
    elif isinstance(value, list):
        value = [v.model_dump(mode="json", by_alias=True) if isinstance(v, BaseModel) else v
                 for v in value]
    typer.echo(json.dumps(value, indent=2, default=str))
