"""``ledger mcp``: the Model Context Protocol server for agents (``ledger.mcp_server``)."""

from __future__ import annotations

import typer

from ledger.cli.context import run, state
from ledger.cli.knobs import option
from ledger.errors import ConfigError
from ledger.runtime.commands import service_command
from ledger.settings import environment


def register(app: typer.Typer) -> None:
    """Add ``mcp`` to ``app``."""
    app.command("mcp")(mcp)


@service_command()
def mcp(
    ctx: typer.Context,
    transport: str = option("mcp_transport"),
    host: str = option("mcp_host"),
    port: int = option("mcp_port"),
    pool_size: int = option("mcp_pool_size"),
    log_level: str = option("log_level", default="warning"),
) -> None:
    """Serve Ledger to agents over MCP: read tools for a reader's token, and the
    previewed bulk actions for an operator's. Tokens are the HTTP API's
    (LEDGER_API_TOKENS); the database decides what each role may do."""
    from ledger import logs

    if transport not in ("stdio", "http"):
        raise typer.BadParameter(f"stdio or http, not {transport!r}", param_hint="--transport")
    try:
        import mcp as _sdk  # noqa: F401 -- the optional extra

        from ledger.mcp_server import LedgerMCP
    except ImportError:
        raise ConfigError("ledger mcp needs the MCP SDK: pip install 'ledger[mcp]'") from None
    from ledger.api.auth import TokenTable
    from ledger.db.readiness import diagnose

    logs.configure(log_level)  # to stderr: on stdio, stdout is the protocol's
    st = state(ctx)
    # as `ledger serve`: a server that cannot use its database says why once, and exits
    problem = diagnose(st.database().url, st.settings.role_prefix)
    if problem is not None:
        raise problem
    token = environment("mcp_token")
    if transport == "stdio" and not token:
        raise ConfigError("ledger mcp on stdio acts with one token: set LEDGER_MCP_TOKEN "
                          "(a reader's or an operator's, from `ledger token create`)")
    database = st.database(service=True)
    server = LedgerMCP(database, TokenTable.parse(st.settings.api_tokens),
                       stdio_token=token if transport == "stdio" else None, pool_size=pool_size)
    run(server.serve_stdio() if transport == "stdio" else server.serve_http(host, port))
