"""Commands on the journal: ``tail`` (resumable, follows live) and ``trim`` (retention)."""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import timezone
from typing import TYPE_CHECKING, Any

import typer

from ledger.cli.context import iso_z, jsonable, run, state
from ledger.cli.knobs import option
from ledger.runtime.commands import service_command

if TYPE_CHECKING:
    from ledger.db.hub import WakeSource
    from ledger.db.models import Event
    from ledger.tail import TailItem

JSON_OPTION = option("json")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")


def register(app: typer.Typer) -> None:
    """Add the journal commands to ``app``."""
    app.command("tail")(tail_)
    app.command("trim")(trim)


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``90s``, ``30m``, ``24h`` or ``7d``."""
    match = _DURATION.match(text)
    if not match:
        raise typer.BadParameter(f"{text!r} is not a duration like 90s, 30m, 24h or 7d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _line(event: Event) -> str:
    """One readable line: seq, time, what happened, from -> to, who."""
    when = event.created_at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if event.type == "transition":
        p = event.payload
        what = p.get("transition") or "closed"
        move = f"{p.get('from') or '-'}→{p.get('to')}"
        extra = "(synthetic: the terminal event lies before the cursor)" \
            if getattr(event, "synthetic", False) else ""
    else:
        what, move = event.type, ""
        extra = json.dumps(event.payload, ensure_ascii=False, default=str)
        extra = extra if len(extra) <= 120 else extra[:119] + "…"
    return "  ".join(part for part in (f"{event.seq:>6}", when, f"{what:<16}", f"{move:<20}",
                                       event.actor, extra) if part).rstrip()


def _record(item: TailItem) -> dict[str, Any]:
    from ledger.tail import Keepalive

    if isinstance(item, Keepalive):
        # No "type": a journal event may be of any type; this is marked like a
        # synthetic event is.
        return {"keepalive": True, "campaign_id": item.campaign_id, "seq": item.seq,
                "at": iso_z(item.at)}
    return jsonable(item)  # type: ignore[no-any-return]


def _emit(text: str) -> None:
    # Flushed per line: a follower is usually piped into something live.
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def tail_(
    ctx: typer.Context,
    campaign_id: int = typer.Argument(..., help="Campaign id."),
    after: int = typer.Option(0, "--from", min=0, metavar="SEQ",
                              help="Resume after this seq (0: from the start)."),
    follow: bool = typer.Option(True, "--follow/--no-follow",
                                help="Keep printing new events until the campaign closes."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Print a campaign's journal, one line per event, and follow it until it closes.

    With --json, one object per line: journal events (a made-up terminal event,
    when resuming past the real one, has "synthetic": true) and, when nothing
    happens for a while, {"keepalive": true, "seq": ...}. Resume with --from SEQ.
    """
    from ledger import logs

    logs.configure("warning")  # stdout is the journal; the hub's troubles go to stderr
    from ledger.db.hub import Hub, NullHub
    from ledger.db.models import Event
    from ledger.db.reads import Reads
    from ledger.tail import tail

    async def go() -> None:
        db = state(ctx).database()
        async with db.session("reader") as session:
            hub: WakeSource = NullHub()
            live: Hub | None = Hub(db) if follow else None
            if live is not None:
                hub = await live.start()
            try:
                async for item in tail(Reads(session), hub, campaign_id, after=after,
                                       follow=follow):
                    if as_json:
                        _emit(json.dumps(_record(item), ensure_ascii=False, default=str))
                    elif isinstance(item, Event):
                        _emit(_line(item))
            finally:
                if live is not None:
                    await live.stop()
    try:
        run(go())
    except BrokenPipeError:
        # The reader went away (| head): not an error. Silence the final flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@service_command(when="every")
def trim(
    ctx: typer.Context,
    older_than: str = typer.Option(..., "--older-than", metavar="DURATION",
                                   help="Trim campaigns closed longer ago than this "
                                        "(90s, 30m, 24h, 7d)."),
    as_json: bool = option("json"),
    every: float | None = typer.Option(None, "--every", min=1.0, metavar="SECONDS",
                                help="Keep running: a pass every this many seconds, until SIGTERM."),
) -> None:
    """Delete output deltas of campaigns closed longer ago than --older-than.

    Runs as the operator role. Transitions and every other event are kept."""
    seconds = parse_duration(older_than)
    from ledger import logs
    from ledger.db.kernel import Kernel

    logs.configure()  # log lines go to stderr; stdout is the result

    async def go() -> int:
        from ledger.roles.trimmer import Trimmer
        from ledger.runtime.host import serve

        async with state(ctx).database().session("operator") as s:
            trimmer = Trimmer(Kernel(s), older_than_s=seconds, interval_s=every or 3600.0)
            if every is None:
                return await trimmer.run_once()
            code = await serve([trimmer], name="trimmer")
            if code:
                raise typer.Exit(code)
            return trimmer.removed
    removed = run(go())
    if as_json:
        typer.echo(json.dumps({"removed": removed, "older_than_s": seconds}))
    else:
        typer.echo(f"removed {removed} delta event{'s' if removed != 1 else ''} "
                   f"of campaigns closed more than {older_than.strip()} ago")
