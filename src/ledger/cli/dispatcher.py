"""``ledger dispatcher``: carry out recorded side effects (the outbox)."""

from __future__ import annotations

import typer

from ledger.runtime.commands import service_command
from ledger.cli.context import console_err, run, state
from ledger.cli.knobs import option
from ledger.cli.runtime import WAIT_OPTION


def register(app: typer.Typer) -> None:
    """Add the dispatcher command to ``app``."""
    app.command("dispatcher")(dispatcher)


@service_command(unless="once")
def dispatcher(
    ctx: typer.Context,
    once: bool = typer.Option(False, "--once", help="Dispatch what is due now, then exit."),
    poll: float = option("poll_s"),
    lease: float = option("dispatcher_lease_s"),
    max_tries: int = typer.Option(8, "--max-tries", min=1,
                                  help="Transient failures before an intent is failed."),
    http_timeout: float = typer.Option(10.0, "--http-timeout", min=0.01,
                                       help="Seconds per HTTP request (lease must exceed 3x)."),
    kind: list[str] = typer.Option([], "--kind",
                                   help="Only these kinds: git.update_ref, http.request "
                                        "(repeatable)."),
    identity: str = typer.Option(None, "--identity",
                                 help="Name recorded on claims (default host:pid:random)."),
    wait_for_database: float = WAIT_OPTION,
    log_level: str = option("log_level"),
) -> None:
    """Claim recorded intents, carry each out with its precondition, read the target
    back and record the outcome -- until SIGTERM/SIGINT (an intent in hand is
    finished first), or with --once until nothing is due."""
    from ledger import logs
    from ledger.roles.dispatcher import Dispatcher
    from ledger.db.hub import Hub
    from ledger.db.kernel import Kernel
    from ledger.runtime.host import serve

    logs.configure(log_level)

    async def go() -> int:
        db = state(ctx).database(wait_s=wait_for_database)
        session = db.session("dispatcher")
        # One LISTEN connection wakes the dispatcher on ledger_outbox; --once
        # never idles, so it needs none.
        hub = None if once else Hub(db, actor="dispatcher")
        try:
            d = Dispatcher(Kernel(session), hub=hub, identity=identity, poll_s=poll,
                           lease_s=lease, max_tries=max_tries, http_timeout_s=http_timeout,
                           kinds=kind or None, data_dir=state(ctx).settings.data_dir)
        except ValueError as exc:  # checked before connecting: a usage error
            raise typer.BadParameter(str(exc)) from None
        async with session:
            if hub is None:
                return await d.run_once()
            # Not waiting for the first LISTEN: wake-ups are hints, and until the
            # hub is up (or while it reconnects) the poll tick still finds every intent.
            await hub.start(wait=False)
            try:
                code = await serve([d], name="dispatcher")
            finally:
                await hub.stop()
            if code:
                raise typer.Exit(code)
            return sum(d.recorded.values())

    handled = run(go())
    console_err.print(f"dispatcher: {handled} side effect(s) dispatched")
