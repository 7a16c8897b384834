"""The ``ledger`` command line. Data goes to stdout, messages to stderr; a
failure is one readable line and a non-zero exit code (see ``ledger.errors``)."""

from __future__ import annotations

import sys

import typer

from ..errors import LedgerError
from . import campaigns, classes, demo, dispatcher, runtime, schema
from . import journal
from . import verifier
from . import serve
from . import drill
from . import gc
from . import logins
from .context import State, console_err

app = typer.Typer(
    name="ledger",
    help="Durable campaigns for fleets of automation and AI-agent workers, kept in PostgreSQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _global(
    ctx: typer.Context,
    database_url: str = typer.Option(
        None, "--database-url", envvar="LEDGER_DATABASE_URL", show_envvar=True,
        help="Administrator connection (URL or conninfo). Unset: the embedded PostgreSQL."),
    data_dir: str = typer.Option(
        None, "--data-dir", envvar="LEDGER_DATA_DIR", show_envvar=True,
        help="Where the embedded server, evidence and worktrees live."),
    role_prefix: str = typer.Option(
        None, "--role-prefix", envvar="LEDGER_ROLE_PREFIX", show_envvar=True,
        help="Prefix of Ledger's database roles (default ledger_)."),
) -> None:
    ctx.obj = State.from_options(database_url=database_url, data_dir=data_dir,
                                 role_prefix=role_prefix)


schema.register(app)
campaigns.register(app)
demo.register(app)
dispatcher.register(app)
journal.register(app)
verifier.register(app)
runtime.register(app)
classes.register(app)
serve.register(app)
drill.register(app)
gc.register(app)
logins.register(app)


def main() -> None:
    """Console entry point: usage errors are typer's (exit 2); Ledger's errors
    are one line on stderr with the error class's exit code."""
    try:
        app()
    except LedgerError as exc:
        console_err.print(f"[bold red]ledger:[/] {exc.message}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
