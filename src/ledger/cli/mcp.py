"""``ledger mcp``: the Model Context Protocol server for agents (``ledger.mcp_server``)."""

from __future__ import annotations

import os

import typer

from ..errors import ConfigError
from .context import run, state


def register(app: typer.Typer) -> None:
    """Add ``mcp`` to ``app``."""
    app.command("mcp")(mcp)


def mcp(
    ctx: typer.Context,
    transport: str = typer.Option("stdio", "--transport", envvar="LEDGER_MCP_TRANSPORT", show_envvar=True,
                                  help="stdio (one agent host; the token is LEDGER_MCP_TOKEN) or http "
                                       "(streamable HTTP on /mcp; each request its own bearer token)."),
    host: str = typer.Option("127.0.0.1", "--host", envvar="LEDGER_MCP_HOST", show_envvar=True,
                             help="Address to listen on (http)."),
    port: int = typer.Option(8090, "--port", min=0, max=65535, envvar="LEDGER_MCP_PORT", show_envvar=True,
                             help="Port to listen on (http)."),
    pool_size: int = typer.Option(5, "--pool-size", min=1, max=100, envvar="LEDGER_MCP_POOL_SIZE",
                                  show_envvar=True, help="Database connections per role."),
    log_level: str = typer.Option("warning", "--log-level", envvar="LEDGER_LOG_LEVEL", show_envvar=True,
                                  help="debug, info, warning or error (logs go to stderr)."),
) -> None:
    """Serve Ledger to agents over MCP: read tools for a reader's token, and the
    previewed bulk actions for an operator's. Tokens are the HTTP API's
    (LEDGER_API_TOKENS); the database decides what each role may do."""
    from .. import logs

    if transport not in ("stdio", "http"):
        raise typer.BadParameter(f"stdio or http, not {transport!r}", param_hint="--transport")
    try:
        from ..mcp_server import LedgerMCP
        import mcp as _sdk  # noqa: F401 -- the optional extra
    except ImportError:
        raise ConfigError("ledger mcp needs the MCP SDK: pip install 'ledger[mcp]'") from None
    from ..api.auth import TokenTable

    from .readiness import diagnose

    logs.configure(log_level)  # to stderr: on stdio, stdout is the protocol's
    st = state(ctx)
    # as `ledger serve`: a server that cannot use its database says why once, and exits
    problem = diagnose(st.database().url, st.settings.role_prefix)
    if problem is not None:
        raise problem
    token = os.environ.get("LEDGER_MCP_TOKEN")
    if transport == "stdio" and not token:
        raise ConfigError("ledger mcp on stdio acts with one token: set LEDGER_MCP_TOKEN "
                          "(a reader's or an operator's, from `ledger token create`)")
    database = st.database()
    database.service = True
    server = LedgerMCP(database, TokenTable.parse(st.settings.api_tokens),
                       stdio_token=token if transport == "stdio" else None, pool_size=pool_size)
    run(server.serve_stdio() if transport == "stdio" else server.serve_http(host, port))
