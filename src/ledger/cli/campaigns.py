"""Commands on campaigns: open, list, show, status, abandon, reopen."""

from __future__ import annotations

import getpass
import socket
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from ledger.cli.context import console, console_err, emit_json, iso_z, run, state
from ledger.cli.knobs import option
from ledger.cli.output import table
from ledger.errors import InvalidInput, LedgerError, NotFound, OutcomeUnknown, Unavailable

if TYPE_CHECKING:
    from ledger.db.kernel import Kernel
    from ledger.db.models import (
        Campaign,
        CampaignDetail,
        LimitWaiting,
        Opened,
        ProcessRow,
        SensorSummary,
    )
    from ledger.report import Report

JSON_OPTION = option("json")


def register(app: typer.Typer) -> None:
    """Add the campaign commands to ``app``."""
    app.command("open")(open_)
    app.command("list")(list_)
    app.command("show")(show)
    app.command("status")(status)
    app.command("abandon")(abandon)
    app.command("reopen")(reopen)
    app.command("report")(report)


def operator_identity() -> str:
    """Who is acting, as recorded in the journal."""
    return f"cli:{getpass.getuser()}@{socket.gethostname()}"


def _ago(when: datetime | None) -> str:
    if when is None:
        return "-"
    seconds = (datetime.now(timezone.utc) - when).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def open_(
    ctx: typer.Context,
    class_: str = typer.Argument(..., metavar="CLASS", help="Campaign class (registered)."),
    objective_key: str = typer.Argument(..., help="Objective key: one open campaign per key."),
    target: str = typer.Argument(..., help="The watched target."),
    priority: int = option("open_priority"),
    label: list[str] = option("open_label"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Open a campaign by hand (as the sensor role); idempotent per objective key."""
    from ledger.db.kernel import Kernel

    # (--priority's range, the kernel's own, is its knob's: refused before an
    # integer too large for the call is sent)
    async def go() -> Opened:
        async with state(ctx).database().session("sensor") as s:
            return await Kernel(s).open_campaign(class_, objective_key, target, priority=priority,
                                                 labels=label, sensor=operator_identity())
    opened = run(go())
    if as_json:
        emit_json(opened)
    else:
        word = "opened" if opened.created else "already open as"
        console.print(f"{word} campaign {opened.campaign_id} ({opened.state})")


def list_(
    ctx: typer.Context,
    state_: list[str] = option("list_state"),
    class_: list[str] = option("list_class"),
    target: str | None = option("list_target"),
    objective: str | None = option("list_objective"),
    label: str | None = option("list_label"),
    updated_since: datetime | None = option("list_updated_since"),
    search: str = option("list_search"),
    limit: int = option("list_limit"),
    cursor: str = option("list_cursor"),
    all_pages: bool = typer.Option(False, "--all", help="Every page, not just the first."),
    as_json: bool = JSON_OPTION,
) -> None:
    """List campaigns, most recently changed first, a page at a time (like the
    API's GET /campaigns). When more remain, the next page's cursor is printed
    on stderr; --all pages through all of them."""
    from ledger.db.cursors import decode_cursor, encode_position
    from ledger.db.reads import Reads

    if updated_since is not None and updated_since.tzinfo is None:
        updated_since = updated_since.replace(tzinfo=timezone.utc)
    position = decode_cursor(cursor) if cursor else None
    _check_filters(state_, class_, {"--target": target, "--objective": objective,
                                    "--label": label}, search)

    async def go() -> tuple[list[Campaign], str | None]:
        rows: list[Campaign] = []
        after = position
        async with state(ctx).database().session("reader") as s:
            reads = Reads(s)
            if class_:
                # A misspelt class would list nothing, as if it had no campaigns.
                known = {c.name for c in await reads.classes()}
                unknown = sorted(set(class_) - known)
                if unknown:
                    raise NotFound(f"--class: no campaign class {', '.join(unknown)} is registered "
                                   f"(registered: {', '.join(sorted(known)) or 'none'})")
            while True:
                # One more than asked: whether it exists says if there is a next page.
                page = await reads.campaigns(
                    states=state_ or None, classes=class_ or None, target=target,
                    objective_key=objective, label=label, updated_since=updated_since,
                    search=search, cursor=after, limit=limit + 1)
                more = len(page) > limit
                rows.extend(page[:limit])
                if not more:
                    return rows, None
                after = (rows[-1].updated_at, rows[-1].id)
                if not all_pages:
                    return rows, encode_position(*after)
    rows, next_cursor = run(go())
    if as_json:
        emit_json(rows)
    else:
        t = table("id", "state", "class", "objective", "target", "attempts", "updated")
        for c in rows:
            t.add_row(str(c.id), c.state, c.class_, c.objective_key, c.target,
                      f"{c.attempt_count}/{c.max_attempts}", _ago(c.updated_at))
        t.print()
    if next_cursor:
        console_err.print(f"more: --cursor {next_cursor}", markup=False, highlight=False,
                          soft_wrap=True)


def _check_filters(states: list[str], classes: list[str], texts: dict[str, str | None],
                   search: str | None) -> None:
    """Refuse the filters ``GET /campaigns`` refuses (422 there, ``InvalidInput`` here)."""
    from ledger.db.models import STATES

    unknown = [s for s in dict.fromkeys(states) if s not in STATES]
    if unknown:
        raise InvalidInput(f"--state: unknown state {', '.join(unknown)} "
                           f"(one of {', '.join(STATES)})")
    limits = [(flag, value, 0, 500) for flag, value in texts.items()]
    limits += [("--search", search, 0, 200)] + [("--class", c, 1, 200) for c in classes]
    for flag, value, shortest, longest in limits:
        if value is not None and not (shortest <= len(value) <= longest and "\x00" not in value):
            size = f"{shortest} to {longest}" if shortest else f"at most {longest}"
            raise InvalidInput(f"{flag}: {size} characters, no NUL")


def show(
    ctx: typer.Context,
    campaign_id: int = typer.Argument(..., help="Campaign id."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Show a campaign: attempts, verdicts, side effects and observations."""
    from ledger.db.reads import Reads

    async def go() -> CampaignDetail:
        async with state(ctx).database().session("reader") as s:
            return await Reads(s).campaign_detail(campaign_id)
    detail = run(go())
    if as_json:
        emit_json(detail)
        return
    c = detail.campaign
    console.print(f"[bold]campaign {c.id}[/]  {c.objective_key}  ({c.class_} on {c.target})")
    console.print(f"state [bold]{c.state}[/]  generation {c.generation}  "
                  f"attempts {c.attempt_count}/{c.max_attempts}  updated {_ago(c.updated_at)}")
    if c.lease_owner:
        console.print(f"leased by {c.lease_owner} until {c.lease_expires_at:%H:%M:%S}")
    if c.waiting_on:
        why = "a system fault" if c.waiting_on == "system_fault" else "its target"
        since = f" for {_ago(c.waiting_since).removesuffix(' ago')}" if c.waiting_since else ""
        console.print(f"[bold]waiting on {why}[/]{since} ({c.fault_count} in a row, nothing charged): "
                      f"{escape(c.waiting_reason or '')}", highlight=False)
    if c.waiting_for:
        console.print(f"[bold]waiting_for: {escape(c.waiting_for)}[/] (nothing charged)", highlight=False)
    if c.limit_keys or c.max_cost is not None or c.cost_spent:
        budget = f"{c.cost_spent:g}/{c.max_cost:g}" if c.max_cost is not None else f"{c.cost_spent:g}"
        console.print(f"limits: keys {', '.join(c.limit_keys) or '-'}; resources "
                      f"{', '.join(c.resources) or '-'}; spent {budget}", highlight=False)
    if c.last_failure_reason:
        console.print(f"last failure: {c.last_failure_reason}")
    if detail.attempts:
        t = table("#", "worker", "outcome", "verdict", "fingerprint", "candidate", title="attempts")
        for a in detail.attempts:
            t.add_row(str(a.attempt_no), a.worker, a.outcome, a.verdict or "-",
                      a.fingerprint or "-", (a.candidate_sha or "-")[:12])
        t.print()
    if detail.verifications:
        t = table("id", "verifier", "status", "reason", title="verifications")
        for v in detail.verifications:
            t.add_row(str(v.id), v.verifier, v.status, v.reason or "-")
        t.print()
    if detail.side_effects:
        t = table("id", "kind", "target", "state", "read back", title="side effects")
        for e in detail.side_effects:
            t.add_row(str(e.id), e.kind, e.target, e.state, str(e.result or "-"))
        t.print()
    if detail.approvals:
        t = table("id", "asked because", "deadline", "decision", "by", "reason", title="approvals")
        for ap in detail.approvals:
            t.add_row(str(ap.id), "; ".join(r.detail for r in ap.reasons),
                      f"{ap.on_timeout} at {iso_z(ap.deadline)}" if ap.deadline else "-",
                      ap.decision or "waiting", ap.decided_by or "-", ap.decision_reason or "-")
        t.print()
    if detail.observations:
        t = table("id", "sensor", "status", "effect", "started", title="observations")
        for o in detail.observations:
            t.add_row(str(o.id), o.sensor, o.status, o.effect, _ago(o.started_at))
        t.print()


def status(
    ctx: typer.Context,
    expiring_within: float = option("status_expiring_within"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Campaigns per state, the age of the oldest ready one, leases about to
    expire, each sensor's last outcome (green, red, or error: how many in a
    row, and why), and the processes that wait to start (and why)."""
    from ledger.db.reads import Reads

    async def go() -> tuple[dict[str, int], datetime | None, list[Campaign], list[SensorSummary],
                            list[ProcessRow], list[LimitWaiting]]:
        async with state(ctx).database().session("reader") as s:
            reads = Reads(s)
            return (await reads.state_counts(), await reads.oldest_ready(),
                    await reads.leases_expiring(expiring_within), await reads.sensor_summaries(1000),
                    await reads.processes_not_ready(), await reads.limits_waiting())
    counts, oldest, expiring, sensors, waiting, limited = run(go())
    if as_json:
        emit_json({"states": counts, "oldest_ready": oldest,
                   "leases_expiring": [{"campaign_id": c.id, "lease_owner": c.lease_owner,
                                        "lease_expires_at": c.lease_expires_at}
                                       for c in expiring],
                   "sensors": [{"sensor": x.sensor, "last_outcome": x.status, "effect": x.effect,
                                "observed_at": x.started_at, "campaign_id": x.campaign_id,
                                "consecutive_errors": x.consecutive_errors,
                                "last_error": x.last_error, "last_error_at": x.last_error_at}
                               for x in sensors],
                   "not_ready": [{"role": p.role, "service": p.service, "host": p.host,
                                  "pid": p.pid, "started_at": p.started_at,
                                  "not_ready": p.not_ready} for p in waiting],
                   "waiting_on_limits": [{"class": w.class_, "kind": w.kind, "campaigns": w.campaigns,
                                          "waiting_for": w.example} for w in limited]})
        return
    t = table("state", "campaigns")
    for name, n in counts.items():
        t.add_row(name, str(n))
    t.print()
    console_err.print(f"oldest ready: {_ago(oldest)}", highlight=False)
    if expiring:
        leases = table("id", "worker", "lease ends", title=f"leases ending within {expiring_within:g}s")
        for c in expiring:
            leases.add_row(str(c.id), c.lease_owner or "-",
                           iso_z(c.lease_expires_at) if c.lease_expires_at else "-")
        leases.print()
    if sensors:
        t = table("sensor", "last", "observed", "errors in a row", "last error", title="sensors")
        for x in sensors:
            t.add_row(x.sensor, x.status or "-", _ago(x.started_at) if x.started_at else "-",
                      str(x.consecutive_errors),
                      f"{_ago(x.last_error_at)}: {x.last_error}" if x.last_error_at else "-",
                      style="red" if x.consecutive_errors else "")
        t.print()
    if limited:
        held = table("class", "campaigns", "waiting_for", title="waiting on limits (nothing charged)")
        for w in limited:
            held.add_row(w.class_, str(w.campaigns), w.example)
        held.print()
    if waiting:
        waits = table("role", "service", "host", "pid", "up since", "why",
                      title="processes not ready (waiting to start)")
        for p in waiting:
            waits.add_row(p.role, p.service, p.host, str(p.pid), _ago(p.started_at), p.not_ready or "")
        waits.print()


def _act_on_each(ctx: typer.Context, campaign_ids: list[int], done: str, as_json: bool,
                 act: Callable[[Kernel, int], Awaitable[int]]) -> None:
    """Act on every id (as the operator) even if some fail, like the API's bulk
    actions; one result per id; exit with the first failure's code."""
    from ledger.db.kernel import Kernel

    results: list[dict[str, object]] = []
    first_failure: LedgerError | None = None

    async def go() -> None:
        nonlocal first_failure
        async with state(ctx).database().session("operator") as s:
            kernel = Kernel(s)
            for cid in campaign_ids:
                try:
                    generation = await act(kernel, cid)
                except LedgerError as exc:
                    if isinstance(exc, Unavailable) and not isinstance(exc, OutcomeUnknown):
                        raise  # not about this campaign: the database cannot be used
                    first_failure = first_failure or exc
                    results.append({"campaign_id": cid, "outcome": exc.slug, "error": exc.message})
                    console_err.print(f"ledger: campaign {cid}: {exc.message}",
                                      markup=False, highlight=False, soft_wrap=True)
                    continue
                results.append({"campaign_id": cid, "outcome": done, "generation": generation})
                if not as_json:
                    console_err.print(f"campaign {cid} {done} (generation {generation})")
    run(go())
    if as_json:
        emit_json(results)
    if first_failure is not None:
        sys.exit(first_failure.exit_code)


def abandon(
    ctx: typer.Context,
    campaign_ids: list[int] = typer.Argument(..., help="Campaign ids."),
    reason: str = option("abandon_reason"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Stop campaigns for good; a worker holding one is fenced out and told to stop."""
    _act_on_each(ctx, campaign_ids, "abandoned", as_json,
                 lambda kernel, cid: kernel.abandon(cid, reason, operator_identity()))


def reopen(
    ctx: typer.Context,
    campaign_ids: list[int] = typer.Argument(..., help="Campaign ids."),
    extra_attempts: int | None = option("reopen_extra_attempts"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Give exhausted campaigns more attempts."""
    _act_on_each(ctx, campaign_ids, "reopened", as_json,
                 lambda kernel, cid: kernel.reopen(cid, operator_identity(), extra_attempts))


def report(
    ctx: typer.Context,
    days: int = option("report_days"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Autonomy per day: opened, attempts, rejections, closures and human actions,
    with the streak of days closed without human help."""
    from ledger.db.reads import Reads
    from ledger.report import autonomy_report

    async def go() -> Report:
        async with state(ctx).database().session("reader") as s:
            return await autonomy_report(Reads(s), days)

    result = run(go())
    if as_json:
        emit_json(result.as_json())
        return
    t = table("day", "opened", "attempts", "rejected", "verified", "confirmed", "human", "verdict")
    for d in result.days:
        style = {"autonomous": "green", "human-assisted": "yellow", "under-exercised": "dim"}.get(d.verdict, "")
        t.add_row(str(d.day), str(d.opened), str(d.attempts), str(d.rejections), str(d.verified),
                  str(d.confirmed), str(d.human_actions), d.verdict, style=style)
    t.print()
    console_err.print(f"streak: {result.streak} autonomous day(s)", highlight=False)
