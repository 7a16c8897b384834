"""What every command shares: settings, the database, the event loop, output.

Imports here stay light (``ledger --help`` loads this module): settings,
the database layer and pydantic are imported when a command first needs them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console

from ledger.settings import inherited_environment

if TYPE_CHECKING:
    from ledger.db.database import Database
    from ledger.settings import Settings

T = TypeVar("T")


def _console(stderr: bool = False) -> Console:
    """A console that, when not on a terminal, never cuts or wraps: tables
    get the width they need and narration stays one line per message."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or inherited_environment().get("COLUMNS"):
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=100_000, soft_wrap=True)


console = _console()  # data (stdout); rich honours NO_COLOR and plain pipes
console_err = _console(stderr=True)  # messages


class State:
    """Per-invocation state built from the global options; the settings are
    read (and validated) only when a command asks for them."""

    #: The invocation's state, for the failure report of ``ledger.cli.main``.
    current: State | None = None

    def __init__(self, options: dict[str, Any]):
        self.options = options
        #: The URL the command last resolved (embedded or configured).
        self.url: str | None = None
        State.current = self

    @classmethod
    def from_options(cls, **options: Any) -> State:
        return cls({k: v for k, v in options.items() if v is not None})

    @cached_property
    def settings(self) -> Settings:
        from pydantic import ValidationError

        from ledger.settings import Settings, settings_error

        overrides = dict(self.options)
        if "data_dir" in overrides:
            overrides["data_dir"] = Path(overrides["data_dir"])
        try:
            return Settings(**overrides)
        except ValidationError as exc:  # one line naming the variable, never the value
            raise settings_error(exc) from None

    def database(self, *, wait_s: float | None = None, ready: bool = False,
                 service: bool = False) -> Database:
        """The database to use (starting the embedded server if none is
        configured). A service passes ``wait_s``: it waits up to that long for
        an unreachable server, but a missing or unmigrated database, a schema
        this code cannot use or a refused login is raised at once with the
        reason (a one-shot command exits with it; a long-running one waits
        for someone to fix it: ``ledger.runtime.startup``). ``ready``: a
        command checks that too, without being a service. A service (one that
        waits, or says ``service``) warns when it holds administrator rights."""
        from ledger.db.database import Database

        db = Database.from_settings(self.settings, wait_for_database_s=wait_s or 0.0,
                                    service=service or wait_s is not None)
        self.url = db.url
        if wait_s is not None or ready:
            from ledger.db.readiness import diagnose
            from ledger.errors import DatabaseMissing, LoginRefused, NotMigrated, SchemaMismatch

            problem = diagnose(db.url, self.settings.role_prefix)
            if isinstance(problem, (DatabaseMissing, LoginRefused, NotMigrated, SchemaMismatch)):
                raise problem
        return db

    def failure_target(self) -> tuple[str | None, str]:
        """The URL and role prefix a failure is diagnosed against."""
        from ledger.errors import ConfigError

        try:
            settings = self.settings
        except (ConfigError, ValueError):  # invalid settings: nothing to diagnose against
            return None, "ledger_"
        return self.url or settings.database_url, settings.role_prefix


def state(ctx: typer.Context) -> State:
    """The invocation's state (from the root command's callback)."""
    return ctx.find_root().obj  # type: ignore[no-any-return]


def run(coro: Awaitable[T]) -> T:
    """Run a coroutine to completion (commands are thin sync shells)."""
    import asyncio  # not at the top: ``ledger --help`` needs no event loop (nor ssl)

    return asyncio.run(coro)  # type: ignore[arg-type]


def iso_z(when: datetime) -> str:
    """A timestamp as the API writes it: ISO 8601 in UTC with ``Z``."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def jsonable(value: Any) -> Any:
    """``value`` as JSON-ready data: models dumped by alias, timestamps as
    ``iso_z``, containers walked."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        value = value.model_dump(mode="python", by_alias=True)
    if isinstance(value, datetime):
        return iso_z(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(value)


def emit_json(value: Any) -> None:
    """Machine-readable output on stdout (timestamps as in the API: ISO 8601, ``Z``)."""
    typer.echo(json.dumps(jsonable(value), indent=2, default=str))
