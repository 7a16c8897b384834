"""Limits and budgets (docs/limits.md), live: each key's use against its
caps, each bucket's rates and wait, usage per class; an operator sets a
key's caps or a bucket's rates and raises a campaign's budget. Every figure
is range-checked by the database (a refusal is a 422 problem naming it);
every change is journaled with ``http:<token name>``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from ledger.api import problems
from ledger.api.campaigns import NO_NUL
from ledger.api.roles import CallerDep
from ledger.db.models import ClassUsage, LimitBucket, LimitEvent, LimitKey

router = APIRouter(tags=["limits"])

KeyName = Annotated[str, Path(pattern=r"^[a-z][a-z0-9_.-]{0,31}:[^\s/]{1,200}$",
                              description="A limit key, KIND:VALUE (repo:app, tenant:acme)")]
ResourceName = Annotated[str, Path(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$",
                                   description="A rate-limited resource")]


class Limits(BaseModel):
    """Every limit key, every bucket, usage per class, the latest changes."""

    keys: list[LimitKey]
    buckets: list[LimitBucket]
    usage: list[ClassUsage]
    events: list[LimitEvent]


class KeyCaps(BaseModel):
    """A key's caps (an absent or null figure lifts that cap)."""

    model_config = ConfigDict(extra="forbid")

    max_leased: int | None = None
    max_verifying: int | None = None
    max_cost_per_day: float | None = None
    weight: int = 1


class BucketRates(BaseModel):
    """A resource's rates (an absent or null rate is not limited)."""

    model_config = ConfigDict(extra="forbid")

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None


class BudgetRaise(BaseModel):
    """A campaign's new budget, above what it spent."""

    model_config = ConfigDict(extra="forbid")

    max_cost: float
    reason: Annotated[str | None, Field(max_length=1000, pattern=NO_NUL)] = None


class BudgetRaised(BaseModel):
    """The campaign's state after its budget was raised."""

    campaign_id: int
    state: str


@router.get("/limits", response_model=Limits, responses=problems.responses(401, 503))
async def show_limits(caller: CallerDep) -> Limits:
    """Each key's use against its caps and today's spend, each bucket's rates
    and how long a claim would wait on it, usage per class, the latest 50
    changes of the limits."""
    reads = caller.reads
    return Limits(keys=await reads.limit_keys(), buckets=await reads.limit_buckets(),
                  usage=await reads.usage_by_class(), events=await reads.limit_events(50))


@router.put("/limits/keys/{key}", response_model=LimitKey,
            responses=problems.responses(401, 403, 422, 503))
async def set_limit(key: KeyName, body: KeyCaps, caller: CallerDep) -> LimitKey:
    """Set a key's caps, live (journaled with the operator)."""
    await caller.kernel.set_limit(key, max_leased=body.max_leased, max_verifying=body.max_verifying,
                                  max_cost_per_day=body.max_cost_per_day, weight=body.weight,
                                  operator=caller.principal.identity)
    return next(k for k in await caller.reads.limit_keys() if k.key == key)


@router.put("/limits/buckets/{resource}", response_model=LimitBucket,
            responses=problems.responses(401, 403, 422, 503))
async def set_bucket(resource: ResourceName, body: BucketRates, caller: CallerDep) -> LimitBucket:
    """Set a resource's rates, live (journaled with the operator)."""
    await caller.kernel.set_bucket(resource, requests_per_minute=body.requests_per_minute,
                                   tokens_per_minute=body.tokens_per_minute,
                                   operator=caller.principal.identity)
    return next(b for b in await caller.reads.limit_buckets() if b.resource == resource)


@router.post("/campaigns/{campaign_id}/budget", response_model=BudgetRaised,
             responses=problems.responses(401, 403, 404, 409, 422, 503))
async def raise_budget(campaign_id: Annotated[int, Path(ge=1, le=2**63 - 1)], body: BudgetRaise,
                       caller: CallerDep) -> BudgetRaised:
    """Raise a campaign's budget above what it spent: a budget_exhausted one
    is attempted again (journaled with the operator and the figures)."""
    state = await caller.kernel.raise_budget(campaign_id, body.max_cost, operator=caller.principal.identity,
                                             reason=body.reason)
    return BudgetRaised(campaign_id=campaign_id, state=state)
