"""``ledger verifier``: the independent verifier runtime as a command."""

from __future__ import annotations

import typer

from ledger.cli.context import console_err, run, state
from ledger.cli.knobs import option
from ledger.cli.runtime import HEALTH_OPTION, LISTEN_OPTION, START_OPTION, WAIT_OPTION
from ledger.runtime.commands import service_command


def register(app: typer.Typer) -> None:
    """Add ``ledger verifier`` to ``app``."""
    app.command("verifier")(verifier)


@service_command(unless="once")
def verifier(
    ctx: typer.Context,
    once: bool = typer.Option(False, "--once", help="Verify what is waiting now, then exit."),
    model_family: str = option("model_family"),
    class_: list[str] = typer.Option([], "--class", help="Verify only these classes (repeatable)."),
    kind: list[str] = typer.Option([], "--kind", help="Give only these verdicts of a class's quorum "
                                   "(verifier kinds such as pytest or review; repeatable; default: any)."),
    poll: float = option("poll_s"),
    lease: float = option("verification_lease_s"),
    listen: bool = LISTEN_OPTION,
    wait_for_database: float = WAIT_OPTION,
    wait_for_start: float | None = START_OPTION,
    health: str | None = HEALTH_OPTION,
    log_level: str = option("log_level"),
) -> None:
    """Check attempted candidates on clean checkouts and record verdicts, until SIGTERM."""
    from contextlib import AsyncExitStack

    from ledger import logs
    from ledger.db.hub import listening
    from ledger.db.kernel import Kernel
    from ledger.roles.verifier import Verifier
    from ledger.runtime.host import serve_when_ready
    from ledger.runtime.service import Service
    from ledger.runtime.startup import Standby

    logs.configure(log_level)
    settings = state(ctx).settings

    async def build(stack: AsyncExitStack, standby: Standby) -> list[Service]:
        db = state(ctx).database(wait_s=wait_for_database)
        standby.through(db)
        await db.check_logins(("verifier", "reader") if listen and not once else ("verifier",))
        session = await stack.enter_async_context(db.session("verifier"))
        hub = await stack.enter_async_context(listening(db, listen and not once))
        return [Verifier(Kernel(session), model_family=model_family, classes=class_ or None,
                         kinds=kind or None, lease_s=lease, poll_s=poll,
                         data_dir=settings.data_dir, hub=hub)]

    async def once_now() -> int:
        import asyncio

        from ledger.sandbox import cell as cells

        # No cell here: one line and 78 before anything connects or is claimed.
        await asyncio.to_thread(cells.check_available)
        async with AsyncExitStack() as stack:
            [v] = await build(stack, Standby("verifier", "verifier"))
            assert isinstance(v, Verifier)
            return await v.drain()

    if not once:
        raise typer.Exit(run(serve_when_ready(build, name="verifier", role="verifier",
                                              wait_s=wait_for_start, health=health)))
    done = run(once_now())
    console_err.print(f"verified {done} candidate(s)", highlight=False)
