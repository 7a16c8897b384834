"""``ledger verifier``: the independent verifier runtime as a command."""

from __future__ import annotations

import typer

from ledger.runtime.commands import service_command
from ledger.cli.context import console_err, run, state
from ledger.cli.knobs import option
from ledger.cli.runtime import LISTEN_OPTION, WAIT_OPTION


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
    log_level: str = option("log_level"),
) -> None:
    """Check attempted candidates on clean checkouts and record verdicts, until SIGTERM."""
    from ledger import logs
    from ledger.db.hub import listening
    from ledger.db.kernel import Kernel
    from ledger.runtime.host import serve
    from ledger.roles.verifier import Verifier

    logs.configure(log_level)
    settings = state(ctx).settings

    async def go() -> int:
        db = state(ctx).database(wait_s=wait_for_database)
        async with db.session("verifier") as session, listening(db, listen and not once) as hub:
            v = Verifier(Kernel(session), model_family=model_family, classes=class_ or None,
                         kinds=kind or None,
                         lease_s=lease, poll_s=poll, data_dir=settings.data_dir, hub=hub)
            if once:
                return await v.drain()
            code = await serve([v], name="verifier")
            if code:
                raise typer.Exit(code)
            return sum(v.verdicts.values())

    done = run(go())
    if once:
        console_err.print(f"verified {done} candidate(s)", highlight=False)
