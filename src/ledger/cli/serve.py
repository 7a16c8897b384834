"""``ledger serve`` (the HTTP API under uvicorn) and ``ledger token create``."""

from __future__ import annotations

import errno
import json
import logging
import socket

import typer

from ledger.cli.context import console_err, state
from ledger.cli.knobs import option
from ledger.errors import CannotListen, LedgerError
from ledger.runtime.commands import service_command

token_app = typer.Typer(help="Bearer tokens of the HTTP API.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``token`` to ``app``."""
    app.command("serve")(serve)
    app.add_typer(token_app, name="token")


@service_command()
def serve(
    ctx: typer.Context,
    host: str = option("api_host"),
    port: int = option("api_port"),
    keepalive: float = option("api_keepalive_s"),
    max_body: int = option("api_max_body"),
    pool_size: int = option("api_pool_size"),
    log_level: str = option("log_level"),
) -> None:
    """Serve the HTTP API: campaigns, event streams, observations, operator
    actions, /metrics, /livez and /readyz. Tokens come from LEDGER_API_TOKENS."""
    import uvicorn

    from ledger import logs
    from ledger.api import ApiOptions, app_from_settings
    from ledger.api.server import ServerLimits, uvicorn_config
    from ledger.db.readiness import diagnose

    logs.configure(log_level)
    st = state(ctx)
    settings = st.settings
    # A server that cannot reach, find or use its database would only answer
    # 503s: say why once, and exit.
    problem = diagnose(st.database().url, settings.role_prefix)
    if problem is not None:
        raise problem
    # Bound here, not by uvicorn: uvicorn exits 3 when it cannot bind, which is
    # our "stale lease"; a busy port is its own error (CannotListen, exit 16).
    sock = listen(host, port)
    shown = f"[{host}]" if ":" in host else host
    logging.getLogger("uvicorn.error").info(  # the line uvicorn logs when it binds itself
        "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", shown, sock.getsockname()[1])
    # The command's options on top of the settings, never instead of them
    # (LEDGER_SESSION_SECRET, LEDGER_SECURE_COOKIES ... stay in force).
    options = ApiOptions.from_settings(settings, keepalive_s=keepalive, max_body_bytes=max_body,
                                       pool_max_size=pool_size)
    app = app_from_settings(settings, options)
    limits = ServerLimits(request_timeout_s=settings.api_request_timeout_s,
                          max_connections=settings.api_max_connections)
    server = uvicorn.Server(uvicorn_config(app, host=host, port=port, limits=limits,
                                           log_level=log_level.lower()))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    if not server.started:
        raise LedgerError("the HTTP API did not start (the lines logged above say why)")


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (0: any free port), as uvicorn would
    bind it; ``CannotListen`` saying why it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CannotListen(f"port {port} on {host} is already in use",
                               hint="stop what listens there, or choose another --port") from None
        hint = {errno.EADDRNOTAVAIL: "--host must be an address of this machine (0.0.0.0: all)",
                errno.EACCES: "a port below 1024 needs privileges: choose another --port"}
        raise CannotListen(f"cannot listen on {where}: {exc.strerror or exc}",
                           hint=hint.get(exc.errno or 0, "check --host and --port")) from None
    sock.listen(2048)  # uvicorn's backlog: a client that connects now waits for the app
    return sock



@token_app.command("create")
def create_token(
    role: str = typer.Argument(..., metavar="ROLE", help="reader, operator or sensor."),
    name: str = option("token_name"),
    as_json: bool = option("json"),
) -> None:
    """Make a random token for ROLE; print it and its LEDGER_API_TOKENS entry.

    Only the entry (a SHA-256 of the token) goes into the server's
    configuration; the token itself is shown once and kept by its user."""
    import secrets

    from ledger.api.auth import ROLES, TOKEN_NAME, TokenEntry, TokenTable, hash_token, new_token

    if role not in ROLES:
        raise typer.BadParameter(f"one of {', '.join(ROLES)}, not {role!r}", param_hint="ROLE")
    name = name or f"{role}-{secrets.token_hex(3)}"
    if not TOKEN_NAME.match(name):
        raise typer.BadParameter(f"{name!r} is not 1-64 of [A-Za-z0-9_.@-]", param_hint="--name")
    token = new_token()
    entry = TokenEntry(name, role, hash_token(token)).entry()
    TokenTable.parse(entry)  # what we print must be what the server accepts
    if as_json:
        typer.echo(json.dumps({"name": name, "role": role, "token": token, "entry": entry}))
        return
    typer.echo(f"token: {token}")
    typer.echo(f"entry: {entry}")
    console_err.print("Give the token to its user now; it is not stored anywhere. Add the "
                      "entry to LEDGER_API_TOKENS (comma-separated) and restart `ledger serve`.",
                      highlight=False)
