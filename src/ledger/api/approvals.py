"""Approval routes (docs/approval.md): what waits for a person, and the
decisions -- approve, deny -- of the operator role.

A decision is made as the caller's role (the database refuses any other
than the operator: 403) and journaled as ``http:<token name>`` with its
reason; the identity that made the attempt may not decide it (403,
``same-identity``); a campaign that does not await approval answers 409.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, ConfigDict, Field

from ledger.api import problems
from ledger.api.campaigns import NO_NUL, CampaignId, Name
from ledger.api.roles import CallerDep
from ledger.db.models import Approval, ApprovalDecision, WaitingApproval

router = APIRouter(tags=["approvals"])

Reason = Annotated[str, Field(min_length=1, max_length=4000, pattern=NO_NUL)]


class ApproveRequest(BaseModel):
    """Why the candidate may land (optional; kept in the journal)."""

    model_config = ConfigDict(extra="forbid")

    reason: Reason | None = None


class DenyRequest(BaseModel):
    """Why it may not (required: the next attempt is told it as a rejection)."""

    model_config = ConfigDict(extra="forbid")

    reason: Reason
    abandon: bool = Field(False, description="Abandon the campaign instead of sending it back "
                                             "to be attempted")


class WaitingApprovals(BaseModel):
    """Candidates that wait for a person, oldest first."""

    items: list[WaitingApproval]


@router.get("/approvals", response_model=WaitingApprovals,
            responses=problems.responses(401, 422, 503))
async def list_approvals(
    caller: CallerDep,
    class_: Annotated[Name | None, Query(alias="class")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> WaitingApprovals:
    """The approvals no one has decided yet: which conditions asked, and when
    the class's timeout decides."""
    return WaitingApprovals(items=await caller.reads.approvals_waiting(class_, limit))


@router.get("/campaigns/{campaign_id}/approvals", response_model=list[Approval],
            responses=problems.responses(401, 404, 422, 503))
async def campaign_approvals(campaign_id: CampaignId, caller: CallerDep) -> list[Approval]:
    """A campaign's approvals, oldest first, and how each was decided."""
    await caller.reads.campaign(campaign_id)  # 404 for an unknown campaign, not []
    return await caller.reads.approvals_of(campaign_id)


@router.post("/campaigns/{campaign_id}/approve", response_model=ApprovalDecision,
             responses=problems.responses(401, 403, 404, 409, 422, 503))
async def approve_campaign(campaign_id: CampaignId, caller: CallerDep,
                           body: Annotated[ApproveRequest | None, Body()] = None) -> ApprovalDecision:
    """Approve a candidate that awaits approval: its promotion is queued (the
    dispatchers are woken)."""
    return await caller.kernel.approve(campaign_id, caller.principal.identity,
                                       (body or ApproveRequest()).reason)


@router.post("/campaigns/{campaign_id}/deny", response_model=ApprovalDecision,
             responses=problems.responses(401, 403, 404, 409, 422, 503))
async def deny_campaign(campaign_id: CampaignId, caller: CallerDep,
                        body: DenyRequest) -> ApprovalDecision:
    """Deny a candidate that awaits approval: back to ready with the reason (its
    approach refused), or abandoned."""
    return await caller.kernel.deny(campaign_id, caller.principal.identity, body.reason,
                                    abandon=body.abandon)
