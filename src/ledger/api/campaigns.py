"""Campaign routes: list (filters, cursor pages), detail, status, operator actions.

Operator actions call the kernel as the caller's role, recording
``http:<token name>`` in the journal; the database refuses a role that may not
(403). Bulk actions follow ``ledger.bulk``: a POST without a selection is a
preview (it acts on nothing and answers the matching ids and a ``selection``
token); to act, POST again with those ``campaign_ids`` and that ``selection``:
only the previewed campaigns that still match are acted on, and what changed
since the preview is answered, not acted on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from ledger import bulk
from ledger.api import bulk_jobs, problems
from ledger.api.roles import CallerDep
from ledger.db.cursors import BIGINT_MAX, decode_cursor, encode_position
from ledger.db.models import Campaign, CampaignDetail, SensorSummary, State
from ledger.errors import InvalidInput

router = APIRouter(tags=["campaigns"])

CampaignId = Annotated[int, Path(ge=1, le=BIGINT_MAX, description="Campaign id")]
#: PostgreSQL text cannot hold NUL: refused here as invalid input (and so
#: documented in the schema) rather than failing in the driver.
NO_NUL = r"^[^\x00]*$"
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=NO_NUL)]
Text = Annotated[str, Field(min_length=1, max_length=500, pattern=NO_NUL)]


# --- cursors ------------------------------------------------------------------


def encode_cursor(campaign: Campaign) -> str:
    """An opaque cursor after ``campaign`` in list order (see ``ledger.db.cursors``)."""
    return encode_position(campaign.updated_at, campaign.id)


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
    """Campaigns per state, the oldest ready one, leases about to expire, and
    each sensor's last outcome with its errors in a row (``GET /sensors``)."""

    states: dict[str, int]
    oldest_ready: datetime | None
    leases_expiring: list[LeaseSummary]
    sensors: list[SensorSummary] = Field(default_factory=list)


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

    def selector(self) -> bulk.Selector:
        """The filter as ``ledger.bulk`` takes it."""
        return bulk.Selector(states=tuple(self.state or ()), classes=tuple(self.class_ or ()),
                             target=self.target, objective_key=self.objective_key,
                             label=self.label, updated_since=self.updated_since)


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


class RetryResult(BaseModel):
    """A ready campaign's backoff skipped: it may be claimed now."""

    campaign_id: int
    outcome: Literal["retry_now"]
    seq: int = Field(description="The journal event that records it")


CampaignIds = Annotated[list[Annotated[int, Field(ge=1, le=BIGINT_MAX)]],
                        Field(max_length=bulk.MAX_CAP)]


class BulkRequest(BaseModel):
    """A bulk action: first a preview, then the previewed campaigns."""

    filter: CampaignFilter
    dry_run: bool | None = Field(
        default=None,
        description="true: only preview. Unset: preview unless `selection` is given. "
                    "false: act, which needs `campaign_ids` and `selection` from a preview")
    campaign_ids: CampaignIds | None = Field(
        default=None, description="To act: the `campaign_ids` a preview answered")
    selection: Annotated[str, Field(max_length=100, pattern=bulk.TOKEN_PATTERN)] | None = \
        Field(default=None, description="To act: the `selection` token a preview answered")
    max_campaigns: Annotated[int, Field(ge=1, le=bulk.MAX_CAP)] = bulk.DEFAULT_CAP

    def previewing(self) -> bool:
        """Whether this request only previews."""
        return self.dry_run if self.dry_run is not None else self.selection is None


class BulkAbandonRequest(BulkRequest):
    """Abandon the open campaigns the filter matches: preview, then confirm."""

    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, Field(min_length=1, max_length=1000, pattern=NO_NUL)] = \
        "abandoned by operator"


class BulkReopenRequest(BulkRequest):
    """Reopen the exhausted campaigns the filter matches: preview, then confirm."""

    model_config = ConfigDict(extra="forbid")

    extra_attempts: Annotated[int, Field(ge=1, le=1000)] | None = None


class BulkResult(BaseModel):
    """A preview (what matches and its `selection`) or what acting did."""

    dry_run: bool
    matched: int = Field(description="Campaigns the filter matches now (at most max_campaigns)")
    truncated: bool = Field(description="More campaigns matched than max_campaigns")
    outcomes: dict[str, int] = Field(description="Per outcome (`abandoned`, `reopened`, or "
                                                 "an error's problem slug): how many")
    campaign_ids: list[int] = Field(description="Preview: what matches. Act: what was acted on")
    selection: str | None = Field(description="Preview: send it back with `campaign_ids` to act")
    not_previewed: list[int] = Field(
        default_factory=list, description="Matching now but not previewed: left alone")
    no_longer_matching: list[int] = Field(
        default_factory=list, description="Previewed but no longer matching: not acted on")
    job_id: str | None = Field(
        default=None, description="The job that acts on a large set in the background "
                                  "(202): follow GET /bulk-jobs/{job_id}/events")


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
    rows = await caller.reads.campaigns(
        states=state, classes=class_, target=target, objective_key=objective_key, label=label,
        updated_since=updated_since, search=search, cursor=position, limit=limit + 1)
    page = rows[:limit]
    more = len(rows) > limit
    return CampaignPage(items=page, next_cursor=encode_cursor(page[-1]) if more else None)


@router.get("/campaigns/{campaign_id}", response_model=CampaignDetail,
            responses=problems.responses(401, 404, 422, 503))
async def show_campaign(campaign_id: CampaignId, caller: CallerDep) -> CampaignDetail:
    """A campaign with its attempts, verifications, side effects and observations."""
    return await caller.reads.campaign_detail(campaign_id)


@router.get("/status", response_model=Status, tags=["status"],
            responses=problems.responses(401, 422, 503))
async def show_status(
    caller: CallerDep,
    expiring_within_s: Annotated[float, Query(ge=0, le=86_400)] = 60.0,
) -> Status:
    """Campaigns per state, the oldest ready one, leases that end within the window, and
    every sensor's last outcome and errors in a row."""
    reads = caller.reads
    expiring = await reads.leases_expiring(expiring_within_s)
    return Status(
        states=await reads.state_counts(),
        oldest_ready=await reads.oldest_ready(),
        leases_expiring=[LeaseSummary(campaign_id=c.id, lease_owner=c.lease_owner,
                                      lease_expires_at=c.lease_expires_at) for c in expiring],
        sensors=await reads.sensor_summaries(1000),
    )


# --- operator actions ------------------------------------------------------------


@router.post("/campaigns/{campaign_id}/abandon", response_model=ActionResult,
             responses=problems.responses(401, 403, 404, 409, 422, 503))
async def abandon_campaign(campaign_id: CampaignId, caller: CallerDep,
                  body: Annotated[AbandonRequest | None, Body()] = None) -> ActionResult:
    """Stop a campaign for good; a worker holding it is fenced out."""
    reason = (body or AbandonRequest()).reason
    generation = await caller.kernel.abandon(campaign_id, reason, caller.principal.identity)
    return ActionResult(campaign_id=campaign_id, outcome="abandoned", generation=generation)


@router.post("/campaigns/{campaign_id}/reopen", response_model=ActionResult,
             responses=problems.responses(401, 403, 404, 409, 422, 503))
async def reopen_campaign(campaign_id: CampaignId, caller: CallerDep,
                 body: Annotated[ReopenRequest | None, Body()] = None) -> ActionResult:
    """Give an exhausted campaign more attempts."""
    extra = (body or ReopenRequest()).extra_attempts
    generation = await caller.kernel.reopen(campaign_id, caller.principal.identity, extra)
    return ActionResult(campaign_id=campaign_id, outcome="reopened", generation=generation)


@router.post("/campaigns/{campaign_id}/retry", response_model=RetryResult,
             responses=problems.responses(401, 403, 404, 409, 422, 503))
async def retry_campaign(campaign_id: CampaignId, caller: CallerDep) -> RetryResult:
    """Let a ready campaign that waits out its backoff be claimed now (journaled)."""
    seq = await caller.kernel.retry_now(campaign_id, caller.principal.identity)
    return RetryResult(campaign_id=campaign_id, outcome="retry_now", seq=seq)


async def _bulk(request: Request, caller: CallerDep, action: str, body: BulkRequest,
                act: Callable[[int], Awaitable[object]]) -> BulkResult | JSONResponse:
    selector = body.filter.selector()
    state = request.app.state.ledger
    key = await bulk_jobs.bulk_key(state)
    if body.previewing():
        preview = await bulk.select(caller.reads, action, selector, body.max_campaigns, key=key,
                                    caller=caller.principal.identity,
                                    ttl_s=state.options.bulk_token_ttl_s)
        return BulkResult(dry_run=True, matched=len(preview.ids), truncated=preview.truncated,
                          outcomes={}, campaign_ids=list(preview.ids), selection=preview.token)
    if body.campaign_ids is None or body.selection is None:
        raise InvalidInput("a bulk action acts only on what was previewed: POST it with "
                           "dry_run first, then send back its campaign_ids and selection")
    done = await bulk_jobs.confirm(state, caller.kernel, caller.reads, caller.principal.identity,
                                   action, selector, body.campaign_ids, body.selection, act,
                                   body.max_campaigns)
    if isinstance(done, str):
        job = await bulk_jobs.read_job(caller.kernel, done)
        accepted = BulkResult(dry_run=False, matched=job.total + len(job.not_previewed),
                              truncated=False, outcomes=job.outcomes, campaign_ids=[],
                              selection=None, not_previewed=job.not_previewed,
                              no_longer_matching=job.no_longer_matching, job_id=done)
        return JSONResponse(accepted.model_dump(mode="json"), status_code=202,
                            headers={"Location": f"/bulk-jobs/{done}"})
    return BulkResult(dry_run=False, matched=len(done.acted_on) + len(done.not_previewed),
                      truncated=done.truncated, outcomes=done.outcomes,
                      campaign_ids=done.acted_on, selection=None,
                      not_previewed=done.not_previewed,
                      no_longer_matching=done.no_longer_matching)


@router.post("/campaigns/abandon", response_model=BulkResult,
             responses=problems.responses(401, 403, 422, 503))
async def abandon_campaigns(request: Request, body: BulkAbandonRequest,
                            caller: CallerDep) -> BulkResult | JSONResponse:
    """Preview, then abandon, the open campaigns a filter matches.

    Without `selection` this only previews (nothing is abandoned): it answers
    the matching `campaign_ids` and a `selection` token. Send both back to
    abandon those of them that still match; campaigns that match by then but
    were not previewed are listed in `not_previewed` and left alone."""
    return await _bulk(request, caller, "abandon", body, lambda cid: caller.kernel.abandon(
        cid, body.reason, caller.principal.identity))


@router.post("/campaigns/reopen", response_model=BulkResult,
             responses=problems.responses(401, 403, 422, 503))
async def reopen_campaigns(request: Request, body: BulkReopenRequest,
                           caller: CallerDep) -> BulkResult | JSONResponse:
    """Preview, then reopen, the exhausted campaigns a filter matches (as for abandon)."""
    return await _bulk(request, caller, "reopen", body, lambda cid: caller.kernel.reopen(
        cid, caller.principal.identity, body.extra_attempts))
