"""``ledger dispatcher``: carry out recorded side effects (the outbox)."""

from __future__ import annotations

import typer

from ledger.cli.context import console_err, run, state
from ledger.cli.knobs import option
from ledger.cli.runtime import HEALTH_OPTION, START_OPTION, WAIT_OPTION
from ledger.runtime.commands import service_command


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
    wait_for_start: float | None = START_OPTION,
    health: str | None = HEALTH_OPTION,
    log_level: str = option("log_level"),
) -> None:
    """Claim recorded intents, carry each out with its precondition, read the target
    back and record the outcome -- until SIGTERM/SIGINT (an intent in hand is
    finished first), or with --once until nothing is due."""
    from contextlib import AsyncExitStack

    from ledger import logs
    from ledger.db.database import Session
    from ledger.db.hub import Hub
    from ledger.db.kernel import Kernel
    from ledger.roles.dispatcher import Dispatcher
    from ledger.runtime.host import serve_when_ready
    from ledger.runtime.service import Service
    from ledger.runtime.startup import Standby

    logs.configure(log_level)

    def build_dispatcher(session: Session, hub: Hub | None) -> Dispatcher:
        try:
            return Dispatcher(Kernel(session), hub=hub, identity=identity, poll_s=poll,
                              lease_s=lease, max_tries=max_tries, http_timeout_s=http_timeout,
                              kinds=kind or None, data_dir=state(ctx).settings.data_dir)
        except ValueError as exc:  # checked before connecting: a usage error
            raise typer.BadParameter(str(exc)) from None

    async def once_now() -> int:
        db = state(ctx).database(wait_s=wait_for_database)
        session = db.session("dispatcher")
        d = build_dispatcher(session, None)  # --once never idles: no LISTEN connection
        async with session:
            return await d.run_once()

    async def build(stack: AsyncExitStack, standby: Standby) -> list[Service]:
        db = state(ctx).database(wait_s=wait_for_database)
        standby.through(db)
        await db.check_logins(("dispatcher",))
        session = db.session("dispatcher")
        # One LISTEN connection wakes the dispatcher on ledger_outbox.
        hub = Hub(db, actor="dispatcher")
        d = build_dispatcher(session, hub)
        await stack.enter_async_context(session)
        # Not waiting for the first LISTEN: wake-ups are hints, and until the
        # hub is up (or while it reconnects) the poll tick still finds every intent.
        await hub.start(wait=False)
        stack.push_async_callback(hub.stop)
        built.append(d)
        return [d]

    built: list[Dispatcher] = []
    if not once:
        code = run(serve_when_ready(build, name="dispatcher", role="dispatcher",
                                    wait_s=wait_for_start, health=health))
        if code:
            raise typer.Exit(code)
        handled = sum(built[-1].recorded.values()) if built else 0
    else:
        handled = run(once_now())
    console_err.print(f"dispatcher: {handled} side effect(s) dispatched")
