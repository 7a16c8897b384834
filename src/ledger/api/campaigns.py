"""Campaign routes: list (filters, cursor pages), detail, status, operator actions.

Operator actions call the kernel as the caller's role, recording
``http:<token name>`` in the journal; the database refuses a role that may not
(403). Bulk actions page through the filter's ids and act on each one, counting
outcomes; ``dry_run`` only counts.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Path, Query
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from ..errors import Forbidden, InvalidInput, LedgerError
from ..kernel import Kernel
from ..models import OPEN_STATES, Campaign, CampaignDetail, State
from . import problems
from .roles import CallerDep

router = APIRouter(tags=["campaigns"])

BIGINT_MAX = 2**63 - 1
CampaignId = Annotated[int, Path(ge=1, le=BIGINT_MAX, description="Campaign id")]
#: PostgreSQL text cannot hold NUL: refused here as invalid input (and so
#: documented in the schema) rather than failing in the driver.
NO_NUL = r"^[^\x00]*$"
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=NO_NUL)]
Text = Annotated[str, Field(min_length=1, max_length=500, pattern=NO_NUL)]


# --- cursors ------------------------------------------------------------------


def encode_cursor(campaign: Campaign) -> str:
    """An opaque cursor after ``campaign`` in list order (updated_at DESC, id DESC)."""
    raw = json.dumps([campaign.updated_at.isoformat(), campaign.id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    """The ``(updated_at, id)`` position a cursor stands for; ``InvalidInput`` if forged."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stamp, ident = json.loads(raw)
        when = datetime.fromisoformat(stamp)
        if when.tzinfo is None or not isinstance(ident, int) or not 0 < ident <= BIGINT_MAX:
            raise ValueError("out of range")
        return when, ident
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidInput("the cursor is not one this server issued") from exc


# --- models -------------------------------------------------------------------


class CampaignPage(BaseModel):
    """A page of campaigns, most recently changed first."""

    items: list[Campaign]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; "
                                                "null on the last page")


class LeaseSummary(BaseModel):
    """A lease that is about to run out."""

    campaign_id: int
    lease_owner: str | None
    lease_expires_at: datetime | None


class Status(BaseModel):
    """Campaigns per state, the oldest ready one and leases about to expire."""

    states: dict[str, int]
    oldest_ready: datetime | None
    leases_expiring: list[LeaseSummary]


class CampaignFilter(BaseModel):
    """Which campaigns a bulk action applies to (every field narrows)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    state: list[State] | None = Field(default=None, max_length=8)
    class_: list[Name] | None = Field(default=None, alias="class", max_length=100)
    target: Text | None = None
    objective_key: Text | None = None
    label: Text | None = None
    updated_since: AwareDatetime | None = None

    def is_empty(self) -> bool:
        """Whether no field narrows anything."""
        return not any(v is not None for v in self.model_dump().values())


class AbandonRequest(BaseModel):
    """Why a campaign is abandoned (kept in the journal)."""

    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(min_length=1, max_length=1000, pattern=NO_NUL)] = \
        "abandoned by operator"


class ReopenRequest(BaseModel):
    """How many more attempts an exhausted campaign gets (default: its class's budget)."""

    model_config = ConfigDict(extra="forbid")

    extra_attempts: Annotated[int, Field(ge=1, le=1000)] | None = None


class ActionResult(BaseModel):
    """What an operator action did."""

    campaign_id: int
    outcome: Literal["abandoned", "reopened"]
    generation: int


class BulkAbandonRequest(AbandonRequest):
    """Abandon every open campaign the filter matches."""

    filter: CampaignFilter
    dry_run: bool = Field(default=False, description="Only count what would be abandoned")
    max_campaigns: Annotated[int, Field(ge=1, le=10_000)] = 1000


class BulkReopenRequest(ReopenRequest):
    """Reopen every exhausted campaign the filter matches."""

    filter: CampaignFilter
    dry_run: bool = Field(default=False, description="Only count what would be reopened")
    max_campaigns: Annotated[int, Field(ge=1, le=10_000)] = 1000


class BulkResult(BaseModel):
    """What a bulk action matched and, per outcome, what became of it."""

    dry_run: bool
    matched: int = Field(description="Campaigns the filter matched (at most max_campaigns)")
    truncated: bool = Field(description="More campaigns matched than max_campaigns")
    outcomes: dict[str, int] = Field(description="Per outcome (`abandoned`, `reopened`, or "
                                                 "an error's problem slug): how many")
    campaign_ids: list[int]


# --- reads ---------------------------------------------------------------------


@router.get("/campaigns", response_model=CampaignPage,
            responses=problems.responses(401, 422, 503))
async def list_campaigns(
    caller: CallerDep,
    state: Annotated[list[State] | None, Query(max_length=8, description="Repeatable")] = None,
    class_: Annotated[list[Name] | None,
                      Query(alias="class", max_length=100, description="Repeatable")] = None,
    target: Annotated[str | None, Query(max_length=500, pattern=NO_NUL)] = None,
    objective_key: Annotated[str | None, Query(max_length=500, pattern=NO_NUL)] = None,
    label: Annotated[str | None, Query(max_length=500, pattern=NO_NUL)] = None,
    updated_since: Annotated[AwareDatetime | None, Query()] = None,
    search: Annotated[str | None, Query(max_length=200, pattern=NO_NUL,
                                        description="Substring of the objective key")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> CampaignPage:
    """Campaigns, most recently changed first, a page at a time."""
    position = decode_cursor(cursor) if cursor else None
    # One more than asked: whether it exists says if there is a next page.
    rows = await caller.kernel.campaigns(
        states=state, classes=class_, target=target, objective_key=objective_key, label=label,
        updated_since=updated_since, search=search, cursor=position, limit=limit + 1)
    page = rows[:limit]
    more = len(rows) > limit
    return CampaignPage(items=page, next_cursor=encode_cursor(page[-1]) if more else None)


@router.get("/campaigns/{campaign_id}", response_model=CampaignDetail,
            responses=problems.responses(401, 404, 422, 503))
async def show_campaign(campaign_id: CampaignId, caller: CallerDep) -> CampaignDetail:
    """A campaign with its attempts, verifications, side effects and observations."""
    return await caller.kernel.campaign_detail(campaign_id)


@router.get("/status", response_model=Status, tags=["status"],
            responses=problems.responses(401, 422, 503))
async def status(
    caller: CallerDep,
    expiring_within_s: Annotated[float, Query(ge=0, le=86_400)] = 60.0,
) -> Status:
    """Campaigns per state, the oldest ready one, leases that end within the window."""
    kernel = caller.kernel
    expiring = await kernel.leases_expiring(expiring_within_s)
    return Status(
        states=await kernel.state_counts(),
        oldest_ready=await kernel.oldest_ready(),
        leases_expiring=[LeaseSummary(campaign_id=c.id, lease_owner=c.lease_owner,
                                      lease_expires_at=c.lease_expires_at) for c in expiring],
    )


# --- operator actions ------------------------------------------------------------


@router.post("/campaigns/{campaign_id}/abandon", response_model=ActionResult,
             responses=problems.responses(401, 403, 404, 409, 422, 503))
async def abandon(campaign_id: CampaignId, caller: CallerDep,
                  body: Annotated[AbandonRequest | None, Body()] = None) -> ActionResult:
    """Stop a campaign for good; a worker holding it is fenced out."""
    reason = (body or AbandonRequest()).reason
    generation = await caller.kernel.abandon(campaign_id, reason, caller.principal.identity)
    return ActionResult(campaign_id=campaign_id, outcome="abandoned", generation=generation)


@router.post("/campaigns/{campaign_id}/reopen", response_model=ActionResult,
             responses=problems.responses(401, 403, 404, 409, 422, 503))
async def reopen(campaign_id: CampaignId, caller: CallerDep,
                 body: Annotated[ReopenRequest | None, Body()] = None) -> ActionResult:
    """Give an exhausted campaign more attempts."""
    extra = (body or ReopenRequest()).extra_attempts
    generation = await caller.kernel.reopen(campaign_id, caller.principal.identity, extra)
    return ActionResult(campaign_id=campaign_id, outcome="reopened", generation=generation)


async def _matching_ids(kernel: Kernel, flt: CampaignFilter, allowed: tuple[State, ...],
                        cap: int) -> tuple[list[int], bool]:
    """Ids of campaigns the filter matches within ``allowed`` states (at most ``cap``)."""
    if flt.is_empty():
        raise InvalidInput("a bulk action needs a filter (state, class, target, "
                           "objective_key, label or updated_since)")
    states = [s for s in allowed if flt.state is None or s in flt.state]
    if not states:
        return [], False
    ids: list[int] = []
    cursor: tuple[datetime, int] | None = None
    while len(ids) <= cap:
        page = await kernel.campaigns(
            states=states, classes=flt.class_, target=flt.target,
            objective_key=flt.objective_key, label=flt.label,
            updated_since=flt.updated_since, cursor=cursor, limit=min(500, cap + 1 - len(ids)))
        ids.extend(c.id for c in page)
        if not page or len(ids) > cap:
            break
        cursor = (page[-1].updated_at, page[-1].id)
    return ids[:cap], len(ids) > cap


async def _act_on_each(ids: list[int], act: Callable[[int], Awaitable[None]],
                       done: str) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    for cid in ids:
        try:
            await act(cid)
            outcome = done
        except Forbidden:
            raise  # the role may not do this at all: no point going on
        except LedgerError as exc:
            outcome = exc.slug  # e.g. illegal-transition: it moved meanwhile
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


@router.post("/campaigns/abandon", response_model=BulkResult,
             responses=problems.responses(401, 403, 422, 503))
async def abandon_many(body: BulkAbandonRequest, caller: CallerDep) -> BulkResult:
    """Abandon every open campaign the filter matches (or, with ``dry_run``, count them)."""
    ids, truncated = await _matching_ids(caller.kernel, body.filter, OPEN_STATES,
                                         body.max_campaigns)
    outcomes: dict[str, int] = {}
    if not body.dry_run:
        async def act(cid: int) -> None:
            await caller.kernel.abandon(cid, body.reason, caller.principal.identity)
        outcomes = await _act_on_each(ids, act, "abandoned")
    return BulkResult(dry_run=body.dry_run, matched=len(ids), truncated=truncated,
                      outcomes=outcomes, campaign_ids=ids)


@router.post("/campaigns/reopen", response_model=BulkResult,
             responses=problems.responses(401, 403, 422, 503))
async def reopen_many(body: BulkReopenRequest, caller: CallerDep) -> BulkResult:
    """Reopen every exhausted campaign the filter matches (or, with ``dry_run``, count them)."""
    ids, truncated = await _matching_ids(caller.kernel, body.filter, ("exhausted",),
                                         body.max_campaigns)
    outcomes: dict[str, int] = {}
    if not body.dry_run:
        async def act(cid: int) -> None:
            await caller.kernel.reopen(cid, caller.principal.identity, body.extra_attempts)
        outcomes = await _act_on_each(ids, act, "reopened")
    return BulkResult(dry_run=body.dry_run, matched=len(ids), truncated=truncated,
                      outcomes=outcomes, campaign_ids=ids)

