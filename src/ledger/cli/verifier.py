"""``ledger verifier``: the independent verifier runtime as a command."""

from __future__ import annotations

import typer

from .context import console_err, run, state
from .runtime import LISTEN_OPTION, WAIT_OPTION


def register(app: typer.Typer) -> None:
    """Add ``ledger verifier`` to ``app``."""
    app.command("verifier")(verifier)


def verifier(
    ctx: typer.Context,
    once: bool = typer.Option(False, "--once", help="Verify what is waiting now, then exit."),
    model_family: str = typer.Option(
        "none", "--model-family", envvar="LEDGER_MODEL_FAMILY", show_envvar=True,
        help="The model family this verifier runs on (recorded with every verdict)."),
    class_: list[str] = typer.Option([], "--class", help="Verify only these classes (repeatable)."),
    kind: list[str] = typer.Option([], "--kind", help="Give only these verdicts of a class's quorum "
                                   "(verifier kinds such as pytest or review; repeatable; default: any)."),
    poll: float = typer.Option(5.0, "--poll", min=0.01, envvar="LEDGER_POLL_S", show_envvar=True,
                               help="Seconds between polls when nothing wakes the verifier."),
    lease: float = typer.Option(30.0, "--lease", min=0.1, envvar="LEDGER_VERIFICATION_LEASE_S",
                                show_envvar=True,
                                help="Verification lease: how soon another verifier may take "
                                     "over if this one dies (heartbeated every third of it)."),
    listen: bool = LISTEN_OPTION,
    wait_for_database: float = WAIT_OPTION,
    log_level: str = typer.Option("info", "--log-level", envvar="LEDGER_LOG_LEVEL",
                                  show_envvar=True, help="debug, info, warning or error."),
) -> None:
    """Check attempted candidates on clean checkouts and record verdicts, until SIGTERM."""
    from .. import logs
    from ..hub import listening
    from ..kernel import Kernel
    from ..runtime.host import serve
    from ..verifier import Verifier

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
