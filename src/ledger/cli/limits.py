"""``ledger limits``: each key's use against its caps, each bucket's level,
usage per class (``show``); a key's caps and a bucket's rates set live
(``set``, ``bucket``); ``ledger raise-budget`` gives a campaign more to
spend. Changes are journaled with ``cli:<user>@<host>``; the database
checks every figure (exit 2 naming the one refused). docs/limits.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from ledger.cli.context import console_err, emit_json, run, state
from ledger.cli.knobs import option
from ledger.cli.output import table

if TYPE_CHECKING:
    from ledger.db.models import ClassUsage, LimitBucket, LimitEvent, LimitKey

limits_app = typer.Typer(help="Limits and budgets: caps per key, rate buckets, usage (docs/limits.md).",
                         no_args_is_help=True)
JSON_OPTION = option("json")


def register(app: typer.Typer) -> None:
    """Add ``ledger limits ...`` and ``ledger raise-budget`` to ``app``."""
    app.add_typer(limits_app, name="limits")
    app.command("raise-budget")(raise_budget)


def _figure(value: float | int | None) -> str:
    return "-" if value is None else f"{value:g}"


@limits_app.command("show")
def show(ctx: typer.Context, as_json: bool = JSON_OPTION) -> None:
    """Each key's leases and verifications against its caps and today's spend,
    each bucket's rates and how long a claim would wait on it, usage per class."""
    from ledger.db.reads import Reads

    async def go() -> tuple[list[LimitKey], list[LimitBucket], list[ClassUsage], list[LimitEvent]]:
        async with state(ctx).database().session("reader") as s:
            reads = Reads(s)
            return (await reads.limit_keys(), await reads.limit_buckets(), await reads.usage_by_class(),
                    await reads.limit_events(10))

    keys, buckets, usage, events = run(go())
    if as_json:
        emit_json({"keys": keys, "buckets": buckets, "usage": usage, "events": events})
        return
    t = table("key", "leased", "verifying", "cost today", "weight", "set by")
    for k in keys:
        t.add_row(k.key, f"{k.leased}/{_figure(k.max_leased)}", f"{k.verifying}/{_figure(k.max_verifying)}",
                  f"{k.cost_today:g}/{_figure(k.max_cost_per_day)}", str(k.weight), k.updated_by or "-")
    t.print()
    b = table("resource", "requests/min", "tokens/min", "requests", "tokens", "wait s")
    for r in buckets:
        b.add_row(r.resource, _figure(r.requests_per_minute), _figure(r.tokens_per_minute), str(r.requests),
                  str(r.tokens), f"{max(r.request_wait_s, r.token_wait_s):.3f}")
    b.print()
    u = table("class", "tokens in", "tokens out", "requests", "cost", "cost today", "attempts")
    for c in usage:
        u.add_row(c.class_, str(c.tokens_in), str(c.tokens_out), str(c.requests), f"{c.cost:g}",
                  f"{c.cost_today:g}", str(c.attempts))
    u.print()
    for e in events:
        console_err.print(f"{e.at.isoformat(timespec='seconds')} {e.type} {e.subject} by {e.actor}",
                          highlight=False)


@limits_app.command("set")
def set_(ctx: typer.Context, key: str = typer.Argument(..., help="The key, KIND:VALUE (repo:app)."),
         max_leased: int | None = option("limit_max_leased"),
         max_verifying: int | None = option("limit_max_verifying"),
         max_cost_per_day: float | None = option("limit_max_cost_per_day"),
         weight: int = option("limit_weight"), as_json: bool = JSON_OPTION) -> None:
    """Set a key's caps, live: an option left out lifts that cap."""
    from ledger.cli.campaigns import operator_identity
    from ledger.db.kernel import Kernel
    from ledger.db.reads import Reads

    async def go() -> LimitKey:
        async with state(ctx).database().session("operator") as s:
            await Kernel(s).set_limit(key, max_leased=max_leased, max_verifying=max_verifying,
                                      max_cost_per_day=max_cost_per_day, weight=weight,
                                      operator=operator_identity())
            return next(k for k in await Reads(s).limit_keys() if k.key == key)

    row = run(go())
    if as_json:
        emit_json(row)
        return
    console_err.print(f"set {row.key}: leased {row.leased}/{_figure(row.max_leased)}, verifying "
                      f"{row.verifying}/{_figure(row.max_verifying)}, cost today "
                      f"{row.cost_today:g}/{_figure(row.max_cost_per_day)}", highlight=False)


@limits_app.command("bucket")
def bucket(ctx: typer.Context, resource: str = typer.Argument(..., help="The resource (model-provider-a)."),
           requests_per_minute: float | None = option("bucket_requests_per_minute"),
           tokens_per_minute: float | None = option("bucket_tokens_per_minute"),
           as_json: bool = JSON_OPTION) -> None:
    """Set a resource's rates, live: a rate left out is not limited."""
    from ledger.cli.campaigns import operator_identity
    from ledger.db.kernel import Kernel
    from ledger.db.reads import Reads

    async def go() -> LimitBucket:
        async with state(ctx).database().session("operator") as s:
            await Kernel(s).set_bucket(resource, requests_per_minute=requests_per_minute,
                                       tokens_per_minute=tokens_per_minute, operator=operator_identity())
            return next(b for b in await Reads(s).limit_buckets() if b.resource == resource)

    row = run(go())
    if as_json:
        emit_json(row)
        return
    console_err.print(f"set {row.resource}: {_figure(row.requests_per_minute)} requests/min, "
                      f"{_figure(row.tokens_per_minute)} tokens/min", highlight=False)


def raise_budget(ctx: typer.Context,
                 campaign_id: int = typer.Argument(..., help="The campaign."),
                 max_cost: float = option("budget_max_cost"),
                 reason: str | None = option("budget_reason"),
                 as_json: bool = JSON_OPTION) -> None:
    """Raise a campaign's budget above what it spent: a budget_exhausted one is
    attempted again (journaled with your identity and the figures)."""
    from ledger.cli.campaigns import operator_identity
    from ledger.db.kernel import Kernel

    async def go() -> str:
        async with state(ctx).database().session("operator") as s:
            return await Kernel(s).raise_budget(campaign_id, max_cost, operator=operator_identity(),
                                                reason=reason)

    new_state = run(go())
    if as_json:
        emit_json({"campaign_id": campaign_id, "state": new_state})
        return
    console_err.print(f"campaign {campaign_id}: budget {max_cost:g}, {new_state}", highlight=False)
