"""The ``ledger`` command line. Data goes to stdout, messages to stderr; a
failure is one readable line and a documented exit code (``failures``).

The command modules import only typer and rich at the top: what a command
needs (the database layer, the kernel, the API ...) is imported inside it, so
``ledger --help`` and ``ledger --version`` start in a fraction of a second.
"""

from __future__ import annotations

import sys

import typer

from ledger.cli import (
    approvals,
    campaigns,
    classes,
    demo,
    dispatcher,
    drill,
    gc,
    journal,
    limits,
    logins,
    mcp,
    runtime,
    schema,
    serve,
    verifier,
)
from ledger.cli.context import State
from ledger.cli.failures import exit_codes_text
from ledger.cli.knobs import option

HELP = ("Durable campaigns for fleets of automation and AI-agent workers, kept in PostgreSQL.\n\n"
        "Data goes to stdout (add --json for machines), messages to stderr. A failure is one "
        "line on stderr and one of these exit codes:\n\n\b\n" + exit_codes_text())

app = typer.Typer(
    name="ledger",
    help=HELP,
    rich_markup_mode=None,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from ledger.release import RELEASE, SCHEMA

        typer.echo(f"ledger {RELEASE} (schema {SCHEMA})")
        raise typer.Exit()


@app.callback()
def _global(
    ctx: typer.Context,
    database_url: str = option("database_url"),
    data_dir: str = option("data_dir"),
    role_prefix: str = option("role_prefix"),
    _show_version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the release and the schema revision it needs, and exit."),
) -> None:
    ctx.obj = State.from_options(database_url=database_url, data_dir=data_dir,
                                 role_prefix=role_prefix)


schema.register(app)
campaigns.register(app)
approvals.register(app)
demo.register(app)
dispatcher.register(app)
journal.register(app)
verifier.register(app)
runtime.register(app)
classes.register(app)
limits.register(app)
serve.register(app)
drill.register(app)
gc.register(app)
logins.register(app)
mcp.register(app)


def main() -> None:
    """Console entry point: usage errors are typer's (exit 2); every other
    failure is one line on stderr with a documented exit code (``failures``).
    Signals are the host's (``ledger.runtime.host``), also while a service
    starts: each command declares whether it is one (``service_command``)."""
    from ledger.ops import faults

    faults.plug_in()
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 -- the one place every failure becomes a line
        from ledger.cli.failures import report

        state = State.current
        url, prefix = state.failure_target() if state else (None, "ledger_")
        sys.exit(report(exc, url, prefix))
