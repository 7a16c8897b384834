"""``ledger logins create``: one login per runtime role."""

from __future__ import annotations

import shlex

import typer

from ledger.cli.context import console_err, state

logins_app = typer.Typer(help="Per-role database logins (instead of the administrator's).",
                         no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``ledger logins`` to ``app``."""
    app.add_typer(logins_app, name="logins")


@logins_app.command("create")
def create(
    ctx: typer.Context,
    password: bool = typer.Option(True, "--password/--cert",
                                  help="Password logins (a random one each), or certificate "
                                       "logins (no password; pg_hba.conf must say cert)."),
    rotate: bool = typer.Option(False, "--rotate",
                                help="Give existing password logins a new password too."),
) -> None:
    """Create one LOGIN role per runtime role (idempotent; run as the
    administrator) and print the LEDGER_<ROLE>_DATABASE_URL entries."""
    from ledger.db.logins import create_logins

    made = create_logins(state(ctx).database(ready=True), auth="password" if password else "cert",
                         rotate=rotate)
    for login in made:
        if login.url is None:
            console_err.print(f"{login.login}: exists, password kept (--rotate for a new one)")
        else:
            typer.echo(f"{login.variable}={shlex.quote(login.url)}")
    created = sum(1 for login in made if login.created)
    console_err.print(f"{created} login(s) created, {len(made) - created} already there")
