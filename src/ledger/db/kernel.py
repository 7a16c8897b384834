"""The kernel client: one typed method per ``ledger_api`` function, same names.

A ``Kernel`` acts as whatever role its executor connects as; calling a function
that role does not own raises ``Forbidden`` (PostgreSQL refuses ``EXECUTE``).
Errors arrive as the ``ledger.errors`` classes, mapped from SQLSTATEs.

Only writes (and the claims that lease) live here. What anyone may read --
campaigns, journals, classes, the dashboard's and the metrics' figures -- is
``ledger.db.reads.Reads``, over the read views, for every role.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from psycopg.types.json import Jsonb
from pydantic import TypeAdapter

from ledger.db.database import Executor
from ledger.db.models import (
    ApprovalDecision,
    ApprovalExpired,
    AttemptRecord,
    AttemptRecorded,
    Claim,
    ClassPause,
    Lease,
    ObservationRecorded,
    Opened,
    ProcessReport,
    Reaped,
    Reobserved,
    SideEffectClaim,
    SideEffectRequested,
    UsageResult,
    VerificationClaim,
)
from ledger.errors import Forbidden, StaleLease

T = TypeVar("T")


#: Kernel functions whose identical retry returns the first result (or does
#: no harm), so ``Session`` may retry them when a reply was lost. The others
#: (claims, abandon, reopen) raise ``OutcomeUnknown`` and their callers read back.
IDEMPOTENT = frozenset({
    "open_campaign", "claim_sensor_tick", "heartbeat", "record_attempt", "record_attempts",
    "fail_attempt", "append_events", "request_side_effect", "expire_leases",
    "heartbeat_verification", "accept", "reject", "complete_side_effect",
    "register_class", "trim_journal", "confirm_side_effect", "refuse_candidate", "register_sensor",
    "report_sensor_process", "report_worker_process", "report_reaper_process",
    "report_verifier_process", "report_dispatcher_process", "report_operator_process",
    "merge_queue_view", "merge_queue_freeze", "merge_queue_landed", "merge_queue_dissolve",
    "reobserve",
    "approve", "deny", "expire_approvals",
    "set_limit", "set_bucket", "set_class_limits", "report_usage",
})
# (rebase_promotion is not: a retry after its commit finds the promotion
# no longer claimed; the dispatcher then reads the campaign back.)


def _class(class_: str | None) -> dict[str, Any]:
    # ``class`` is a keyword in Python, not in the API's argument names.
    return {"class": class_}


def _traced(trace_context: Mapping[str, str] | None) -> dict[str, Any]:
    # Named only when given: an untraced call is the statement it always was.
    return {"trace_context": dict(trace_context)} if trace_context else {}


def _attempted_hints(campaign_ids: Sequence[int]) -> list[tuple[str, str]]:
    # Recorded attempts wake verifiers (ledger_attempted) and tails
    # (ledger_event); the kernel function leaves these two to the caller.
    return [(channel, str(cid)) for cid in campaign_ids for channel in ("ledger_attempted", "ledger_event")]


class Leases:
    """The leases this process was granted, as far as their replies said:
    each (kind, id, generation) with the local monotonic time it ends by the
    database's clock (the reply's remaining length from just before the call
    was sent: never later than the database's own expiry). A lease holder's
    call made without a deadline of its own is bounded by its lease -- it
    cannot count after the lease is over -- instead of ``CALL_TIMEOUT_S``."""

    LIMIT = 10_000
    FLOOR_S = 1.0

    def __init__(self) -> None:
        self._ends: dict[tuple[str, int, int], float] = {}

    def granted(self, key: tuple[str, int, int], sent: float, remaining_s: float) -> None:
        self._ends.pop(key, None)
        self._ends[key] = sent + max(remaining_s, 0.0)
        while len(self._ends) > self.LIMIT:  # oldest first
            del self._ends[next(iter(self._ends))]

    def ended(self, key: tuple[str, int, int]) -> None:
        self._ends.pop(key, None)

    def bound(self, key: tuple[str, int, int], timeout_s: float | None) -> float | None:
        """``timeout_s`` if given, else the time the lease has left, else
        ``None`` (unknown here: the executor's own default). At least
        ``FLOOR_S``: a lease already over by the local clock gets its answer
        from the database (stale, most likely) rather than a connection
        dropped at once, whose outcome would be unknown."""
        if timeout_s is not None:
            return timeout_s
        end = self._ends.get(key)
        return None if end is None else max(end - time.monotonic(), self.FLOOR_S)


#: This process's leases (``Leases``), shared by every Kernel of the process.
LEASES = Leases()


_CLAIMS = TypeAdapter(list[Claim])
_RECORDED = TypeAdapter(list[AttemptRecorded])


class Kernel:
    """Typed access to the write API (``ledger_api``)."""

    def __init__(self, executor: Executor):
        self.executor = executor

    def within(self, executor: Executor) -> Kernel:
        """The same API bound to another executor (e.g. an open transaction)."""
        return Kernel(executor)

    async def _call(self, function: str, /, *, _timeout_s: float | None = None,
                    _idempotent: bool | None = None, **args: Any) -> list[dict[str, Any]]:
        idempotent = function in IDEMPOTENT if _idempotent is None else _idempotent
        return await self.executor.call(function, args, idempotent=idempotent, timeout_s=_timeout_s)

    async def _scalar(self, function: str, /, **args: Any) -> Any:
        rows = await self._call(function, **args)
        return next(iter(rows[0].values())) if rows else None

    async def _scalar_as(self, kind: type[T], function: str, /, **args: Any) -> T:
        """``_scalar``, checked to be a ``kind`` (the function's declared result)."""
        value = await self._scalar(function, **args)
        if not isinstance(value, kind):
            raise TypeError(f"ledger_api.{function} returned {value!r}, not {kind.__name__}")
        return value

    # --- sensors -------------------------------------------------------------

    async def open_campaign(
        self,
        class_: str,
        objective_key: str,
        target: str,
        *,
        desired_state: dict[str, Any] | None = None,
        observation: dict[str, Any] | None = None,
        priority: int = 0,
        seat: str | None = None,
        labels: Sequence[str] = (),
        acceptance: dict[str, Any] | None = None,
        sensor: str | None = None,
        trace_context: Mapping[str, str] | None = None,
    ) -> Opened:
        """Open a campaign for an objective, or return the one already open;
        a campaign this opens keeps ``trace_context`` (the opener's W3C trace
        context, ``ledger.tracing``)."""
        rows = await self._call(
            "open_campaign", **_class(class_), objective_key=objective_key, target=target,
            desired_state=desired_state or {}, observation=observation or {}, priority=priority,
            seat=seat, labels=list(labels), acceptance=acceptance, sensor=sensor,
            **_traced(trace_context),
        )
        return Opened.model_validate(rows[0])

    async def record_observation(
        self,
        sensor: str,
        objective_key: str,
        target: str,
        status: str,
        started_at: datetime,
        *,
        finished_at: datetime | None = None,
        details: dict[str, Any] | None = None,
        class_: str | None = None,
        tick: datetime | None = None,
        idempotency_key: str | None = None,
        request_digest: str | None = None,
        desired_state: dict[str, Any] | None = None,
        labels: Sequence[str] = (),
        trace_context: Mapping[str, str] | None = None,
        open_after: int = 1,
        confirm_after: int = 1,
    ) -> ObservationRecorded:
        """Record an observation (``status``: green, red or error) and apply
        what it implies (open, regress, confirm, dismiss; an error implies
        nothing); a red counts only as the ``open_after``-th in a row, a green
        as the ``confirm_after``-th. A campaign it opens keeps ``trace_context``."""
        rows = await self._call(
            "record_observation", _idempotent=tick is not None or idempotency_key is not None,
            sensor=sensor, objective_key=objective_key, target=target,
            status=status, started_at=started_at, finished_at=finished_at,
            details=details or {}, **_class(class_), tick=tick,
            idempotency_key=idempotency_key, request_digest=request_digest,
            desired_state=desired_state or {}, labels=list(labels), **_traced(trace_context),
            open_after=open_after, confirm_after=confirm_after,
        )
        return ObservationRecorded.model_validate(rows[0])

    async def register_sensor(self, sensor: str, identity: str) -> datetime:
        """Register a sensor the first time it runs; returns when it was registered
        (ticks before that are never observed)."""
        return await self._scalar_as(datetime, "register_sensor", sensor=sensor, identity=identity)

    async def claim_sensor_tick(self, sensor: str, tick: datetime, identity: str) -> bool:
        """Own one scheduled tick of a sensor; ``False`` if another process has it."""
        return bool(await self._scalar("claim_sensor_tick", sensor=sensor, tick=tick,
                                       identity=identity))

    # --- workers -------------------------------------------------------------

    async def claim_campaign(self, worker: str, classes: Sequence[str] | None = None) -> Claim | None:
        """Lease the next eligible campaign, or ``None`` if there is none."""
        sent = time.monotonic()
        rows = await self._call("claim_campaign", worker=worker,
                                classes=list(classes) if classes is not None else None)
        if not rows:
            return None
        claim = Claim.model_validate(rows[0])
        LEASES.granted(("campaign", claim.campaign_id, claim.generation), sent, claim.lease_remaining_s)
        return claim

    async def claim_campaigns(self, worker: str, classes: Sequence[str] | None = None, *,
                              limit: int = 10) -> list[Claim]:
        """Lease up to ``limit`` eligible campaigns in one statement, each with
        its own generation, lease and attempt; an empty list if none is ready."""
        sent = time.monotonic()
        rows = await self._call("claim_campaigns", worker=worker, limit=limit,
                                classes=list(classes) if classes is not None else None)
        claims = _CLAIMS.validate_python(rows)  # one call for the batch, not one per row
        for claim in claims:
            LEASES.granted(("campaign", claim.campaign_id, claim.generation), sent, claim.lease_remaining_s)
        return claims

    async def heartbeat(self, campaign_id: int, generation: int, *,
                        timeout_s: float | None = None) -> Lease:
        """Roll the lease forward; ``StaleLease`` means stand down (the lease
        was reaped, abandoned, re-claimed, or had already expired). Without
        ``timeout_s``, bounded by the lease as far as this process knows it
        (``Leases``)."""
        key = ("campaign", campaign_id, generation)
        sent = time.monotonic()
        rows = await self._call("heartbeat", _timeout_s=LEASES.bound(key, timeout_s),
                                campaign_id=campaign_id, generation=generation)
        lease = Lease.model_validate(rows[0])
        LEASES.granted(key, sent, lease.lease_remaining_s)
        return lease

    async def record_attempt(
        self,
        campaign_id: int,
        generation: int,
        *,
        base_sha: str | None,
        candidate_sha: str,
        fingerprint: str,
        bundle: dict[str, Any] | None = None,
        bundle_digest: str | None = None,
        evidence_location: str | None = None,
        log_tail: str | None = None,
        diff: bytes | None = None,
        candidate_ref: str | None = None,
        timeout_s: float | None = None,
    ) -> int:
        """Record the candidate (leased -> attempted) with its evidence (the
        bundle, its diff, the ref it was published under); returns the
        attempt number. Retrying the identical record returns the same number;
        verifiers and tails are hinted after the commit (``Session.hint``)."""
        attempt_no = await self._scalar_as(
            int, "record_attempt", _timeout_s=LEASES.bound(("campaign", campaign_id, generation), timeout_s),
            campaign_id=campaign_id, generation=generation,
            base_sha=base_sha, candidate_sha=candidate_sha, fingerprint=fingerprint,
            bundle=bundle, bundle_digest=bundle_digest, evidence_location=evidence_location,
            log_tail=log_tail, diff=diff, candidate_ref=candidate_ref,
        )
        LEASES.ended(("campaign", campaign_id, generation))
        await self.executor.hint(_attempted_hints([campaign_id]))
        return attempt_no

    async def record_attempts(self, attempts: Sequence[AttemptRecord | Mapping[str, Any]]) -> list[AttemptRecorded]:
        """Record many candidates in one call. A lost lease comes back as
        ``stale`` for that item (stand down for it); bad input or a repeated
        failed approach fails the whole call, as ``record_attempt`` would."""
        items = [a if isinstance(a, AttemptRecord) else AttemptRecord.model_validate(a) for a in attempts]
        rows = await self._call("record_attempts",
                                attempts=[i.model_dump(exclude_none=True) for i in items])
        results = _RECORDED.validate_python(rows)
        for result in results:  # over, recorded or stale (and no evictions for a busy batch worker)
            LEASES.ended(("campaign", result.campaign_id, result.generation))
        await self.executor.hint(_attempted_hints([r.campaign_id for r in results if r.status == "recorded"]))
        return results

    async def fail_attempt(
        self,
        campaign_id: int,
        generation: int,
        reason: str,
        *,
        fingerprint: str | None = None,
        retry_after_s: float | None = None,
        drained: bool = False,
        timeout_s: float | None = None,
    ) -> str:
        """Record a failed (or drained) attempt; returns the new state.
        Retrying the identical ending returns the same state."""
        state = await self._scalar_as(
            str, "fail_attempt", _timeout_s=LEASES.bound(("campaign", campaign_id, generation), timeout_s),
            campaign_id=campaign_id, generation=generation,
            reason=reason, fingerprint=fingerprint, retry_after_s=retry_after_s, drained=drained,
        )
        LEASES.ended(("campaign", campaign_id, generation))
        return state

    async def release_attempt(self, campaign_id: int, generation: int, reason: str, *,
                              retry_after_s: float | None = None,
                              timeout_s: float | None = None) -> str:
        """A fault that is not the attempt's own stopped it (leased -> ready,
        the release transition): nothing charged, no approach refused; the
        campaign waits (``waiting_on = system_fault``) and is retried after
        a pause. Returns the new state; an identical retry returns it again."""
        return await self._scalar_as(str, "release_attempt",
                                     _timeout_s=LEASES.bound(("campaign", campaign_id, generation), timeout_s),
                                     campaign_id=campaign_id, generation=generation, reason=reason,
                                     retry_after_s=retry_after_s)

    async def reobserve(self, campaign_id: int, generation: int, sensor: str, status: str,
                        started_at: datetime, *, finished_at: datetime | None = None,
                        details: dict[str, Any] | None = None, moment: str = "before_start",
                        timeout_s: float | None = None) -> Reobserved:
        """Record the lease holder's own observation of its campaign's target
        (the class's sensor, run once in a cell) ``before_start`` or when the
        attempt ``changed_nothing``: green dismisses the campaign (leased ->
        dismissed, nothing charged); red or error changes nothing. An
        identical retry returns the first result."""
        rows = await self._call("reobserve", _timeout_s=timeout_s, campaign_id=campaign_id,
                                generation=generation, sensor=sensor, status=status,
                                started_at=started_at, finished_at=finished_at,
                                details=details or {}, moment=moment)
        return Reobserved.model_validate(rows[0])

    async def report_security_event(self, campaign_id: int, generation: int, action: str,
                                    reason: str, *, details: dict[str, Any] | None = None,
                                    timeout_s: float | None = None) -> int:
        """Record what the attempt tried outside its cell (``security_event``,
        journaled as ``security.detected``); returns the record's id (the
        same one when the report is retried)."""
        return await self._scalar_as(int, "report_security_event", _timeout_s=timeout_s,
                                     campaign_id=campaign_id, generation=generation, action=action,
                                     reason=reason, details=details or {})

    async def report_usage(self, campaign_id: int, generation: int, *, tokens_in: int = 0,
                           tokens_out: int = 0, requests: int = 0, cost: float = 0.0,
                           key: str | None = None, timeout_s: float | None = None) -> UsageResult:
        """Add what the attempt reported it used (increments; fenced; every
        figure range-checked, ``InvalidInput`` naming the one refused). With
        ``key``, a retried report counts once. Says the campaign's spend
        against its budget."""
        rows = await self._call("report_usage", _timeout_s=timeout_s, campaign_id=campaign_id,
                                generation=generation, tokens_in=tokens_in, tokens_out=tokens_out,
                                requests=requests, cost=cost, key=key)
        return UsageResult.model_validate(rows[0])

    async def refuse_candidate(self, campaign_id: int, generation: int, reason: str, *,
                               fingerprint: str, paths: Sequence[str],
                               timeout_s: float | None = None) -> str:
        """Fail the attempt because its candidate changed protected ``paths``: as
        ``fail_attempt`` (fenced; the reason is the failure reason, the
        fingerprint is refused from now on), plus a ``security_event`` row and
        a ``security.refused`` journal entry. Returns the new state (the same
        one when the identical refusal is retried)."""
        return await self._scalar_as(str, "refuse_candidate", _timeout_s=timeout_s, campaign_id=campaign_id,
                                  generation=generation, reason=reason, fingerprint=fingerprint,
                                  paths=list(paths))

    async def append_events(self, campaign_id: int, generation: int,
                            events: Sequence[dict[str, Any]], *, key: str | None = None,
                            timeout_s: float | None = None) -> int:
        """Append events to the journal, fenced by generation and lease; returns
        the last seq. With ``key`` (unique per batch) a retry of the same batch
        returns the first try's seq instead of appending twice."""
        return await self._scalar_as(int, "append_events",
                                  _timeout_s=LEASES.bound(("campaign", campaign_id, generation), timeout_s),
                                  _idempotent=key is not None, campaign_id=campaign_id,
                                  generation=generation, events=list(events), key=key)

    async def request_side_effect(
        self,
        campaign_id: int,
        generation: int,
        *,
        kind: str,
        target: str,
        precondition: dict[str, Any],
        idempotency_key: str,
        payload: dict[str, Any] | None = None,
    ) -> SideEffectRequested:
        """Record an intent (outbox). Outside the class's authority: ``Forbidden``
        (and a ``security_event`` row that outlives the refusal)."""
        rows = await self._call(
            "request_side_effect", campaign_id=campaign_id, generation=generation, kind=kind,
            target=target, precondition=precondition, idempotency_key=idempotency_key,
            payload=payload or {},
        )
        if rows[0]["status"] == "forbidden":
            raise Forbidden(f"{kind} on {target} is outside the authority profile of this campaign")
        return SideEffectRequested.model_validate(rows[0])

    # --- reaper --------------------------------------------------------------

    async def expire_leases(self, grace_s: float = 0.0, limit: int = 100) -> list[Reaped]:
        """Return leases expired for longer than ``grace_s`` to ready."""
        rows = await self._call("expire_leases", grace_s=grace_s, limit=limit)
        return [Reaped.model_validate(r) for r in rows]

    async def expire_approvals(self, limit: int = 100) -> list[ApprovalExpired]:
        """Decide the approvals whose deadline passed, as each class says
        (deny, abandon or approve): the system's decision."""
        rows = await self._call("expire_approvals", limit=limit)
        return [ApprovalExpired.model_validate(r) for r in rows]

    # --- verifiers -----------------------------------------------------------

    async def claim_verification(self, verifier: str, *, model_family: str | None = None,
                                 lease_s: float = 120.0,
                                 classes: Sequence[str] | None = None,
                                 kinds: Sequence[str] | None = None) -> VerificationClaim | None:
        """Claim an attempted campaign to verify, or ``None``: the next verdict
        its class's quorum needs, of one of ``kinds`` (default: any)."""
        sent = time.monotonic()
        rows = await self._call("claim_verification", verifier=verifier,
                                model_family=model_family, lease_s=lease_s,
                                classes=list(classes) if classes is not None else None,
                                kinds=list(kinds) if kinds is not None else None)
        if not rows:
            return None
        claim = VerificationClaim.model_validate(rows[0])
        LEASES.granted(("verification", claim.verification_id, 0), sent, claim.lease_remaining_s)
        return claim

    async def heartbeat_verification(self, verification_id: int, lease_s: float = 120.0, *,
                                     timeout_s: float | None = None) -> Lease:
        """Extend a verification's lease; ``StaleLease`` if it is no longer
        current. Without ``timeout_s``, bounded by the lease (``Leases``)."""
        key = ("verification", verification_id, 0)
        sent = time.monotonic()
        rows = await self._call("heartbeat_verification", _timeout_s=LEASES.bound(key, timeout_s),
                                verification_id=verification_id, lease_s=lease_s)
        lease = Lease.model_validate(rows[0])
        LEASES.granted(key, sent, lease.lease_remaining_s)
        return lease

    async def accept(self, verification_id: int, evidence: dict[str, Any] | None = None, *,
                     timeout_s: float | None = None) -> int | None:
        """Accept the candidate (attempted -> verified, once every verifier of
        the class's quorum has); returns the promotion intent id (the same one
        when an accept is retried), ``None`` while the quorum is incomplete or
        when the class does not promote."""
        intent: int | None = await self._scalar("accept", _timeout_s=LEASES.bound(
                                                    ("verification", verification_id, 0), timeout_s),
                                                verification_id=verification_id,
                                                evidence=evidence or {})
        return intent

    async def reject(self, verification_id: int, reason: str,
                     evidence: dict[str, Any] | None = None, *, timeout_s: float | None = None) -> str:
        """Reject the candidate (attempted -> ready/exhausted); returns the new
        state (the same one when a reject with the same reason is retried)."""
        return await self._scalar_as(str, "reject", _timeout_s=LEASES.bound(
                                         ("verification", verification_id, 0), timeout_s),
                                     verification_id=verification_id,
                                  reason=reason, evidence=evidence or {})

    async def release_verification(self, verification_id: int, reason: str, *,
                                   retry_after_s: float | None = None,
                                   timeout_s: float | None = None) -> str:
        """The check could not be made for a reason that is not the
        candidate's: no verdict, nothing charged; the campaign stays
        attempted, says why it waits, and is verified again after a pause."""
        return await self._scalar_as(str, "release_verification", _timeout_s=LEASES.bound(
                                         ("verification", verification_id, 0), timeout_s),
                                     verification_id=verification_id, reason=reason,
                                     retry_after_s=retry_after_s)

    # --- dispatchers ---------------------------------------------------------

    async def claim_side_effect(self, dispatcher: str, *, lease_s: float = 60.0,
                                kinds: Sequence[str] | None = None) -> SideEffectClaim | None:
        """Claim the next due intent, or ``None`` (this release knows campaigns
        that await approval: their notices are handed to it too)."""
        rows = await self._call("claim_side_effect", dispatcher=dispatcher, lease_s=lease_s,
                                kinds=list(kinds) if kinds is not None else None, approvals=True)
        return SideEffectClaim.model_validate(rows[0]) if rows else None

    async def confirm_side_effect(self, side_effect_id: int, claim_token: int, *,
                                  lease_s: float = 60.0, timeout_s: float | None = None) -> Lease:
        """Just before acting: is this claim still ours and the intent's
        generation still live? Extends the claim's lease and returns it;
        ``StaleLease`` (and the intent cancelled, if its generation died)
        means do not act."""
        rows = await self._call("confirm_side_effect", _timeout_s=timeout_s,
                                side_effect_id=side_effect_id, claim_token=claim_token,
                                lease_s=lease_s)
        status = rows[0]["status"]
        if status != "live":
            raise StaleLease(f"side effect {side_effect_id}: "
                             + ("its generation is no longer live; it was cancelled"
                                if status == "cancelled" else "the claim is no longer this dispatcher's"),
                             detail=status)
        return Lease.model_validate(rows[0])

    async def rebase_promotion(self, side_effect_id: int, claim_token: int, *, base_sha: str,
                               candidate_sha: str, bundle: dict[str, Any], bundle_digest: str,
                               evidence_location: str | None = None, diff: bytes | None = None,
                               candidate_ref: str | None = None) -> int:
        """The promotion's target moved and its candidate was rebased onto it:
        send the campaign back for verification (verified -> attempted, a new
        generation and attempt row); returns the new attempt number. Verifiers
        and tails are hinted after the commit."""
        rows = await self._call("rebase_promotion", side_effect_id=side_effect_id,
                                claim_token=claim_token, base_sha=base_sha,
                                candidate_sha=candidate_sha, bundle=bundle,
                                bundle_digest=bundle_digest, evidence_location=evidence_location,
                                diff=diff, candidate_ref=candidate_ref)
        await self.executor.hint(_attempted_hints([rows[0]["campaign_id"]]))
        return int(rows[0]["attempt_no"])

    # --- the merge queue (merge_queue.sql) ------------------------------------

    async def merge_queue_view(self, side_effect_id: int, claim_token: int, *,
                               limit: int = 64) -> dict[str, Any] | None:
        """The claimed promotion's queue: its target's open batch, the last
        closed one, the waiting members in order and the class's knobs;
        ``None`` when the intent is not queued."""
        view = await self._scalar("merge_queue_view", side_effect_id=side_effect_id,
                                  claim_token=claim_token, limit=limit)
        return view if isinstance(view, dict) else None

    async def merge_queue_stack(self, side_effect_id: int, claim_token: int, *, base_sha: str,
                                members: Sequence[int], generations: Sequence[int],
                                stack: Sequence[str], changes: list[dict[str, Any]],
                                suspect: int | None, bundle: dict[str, Any], bundle_digest: str,
                                diff: bytes, candidate_ref: str) -> int:
        """Record a batch stacked onto the moved target and send its probe
        to be verified (the head's claim is given back); the batch's id."""
        batch = await self._scalar_as(
            int, "merge_queue_stack", side_effect_id=side_effect_id, claim_token=claim_token,
            base_sha=base_sha, members=list(members), generations=list(generations),
            stack=list(stack), changes=changes, suspect=suspect, bundle=bundle,
            bundle_digest=bundle_digest, diff=diff, candidate_ref=candidate_ref)
        await self.executor.hint(_attempted_hints([members[-1]]))
        return batch

    async def merge_queue_freeze(self, batch_id: int, side_effect_id: int, claim_token: int,
                                 landed: Sequence[str]) -> bool:
        """Freeze the commits a passed batch lands; ``False`` if a member left
        (the batch is dissolved, nothing to carry out)."""
        return await self._scalar_as(bool, "merge_queue_freeze", batch_id=batch_id,
                                     side_effect_id=side_effect_id, claim_token=claim_token,
                                     landed=list(landed))

    async def merge_queue_landed(self, batch_id: int, side_effect_id: int, claim_token: int,
                                 read_back: str, dispatcher: str) -> int:
        """The target shows the batch's top: every member's promotion done."""
        return await self._scalar_as(int, "merge_queue_landed", batch_id=batch_id,
                                     side_effect_id=side_effect_id, claim_token=claim_token,
                                     read_back=read_back, dispatcher=dispatcher)

    async def merge_queue_dissolve(self, batch_id: int, side_effect_id: int, claim_token: int,
                                   reason: str) -> None:
        """End a batch whose target moved outside the queue."""
        await self._call("merge_queue_dissolve", batch_id=batch_id, side_effect_id=side_effect_id,
                         claim_token=claim_token, reason=reason)

    async def complete_side_effect(self, side_effect_id: int, claim_token: int, outcome: str, *,
                                   result: dict[str, Any] | None = None, error: str | None = None,
                                   retry_after_s: float = 5.0, timeout_s: float | None = None) -> str:
        """Record what the read-back showed: done, conflict, retry or failed
        (a retried identical record returns the state it left)."""
        return await self._scalar_as(str, "complete_side_effect", _timeout_s=timeout_s,
                                  side_effect_id=side_effect_id,
                                  claim_token=claim_token, outcome=outcome, result=result or {},
                                  error=error, retry_after_s=retry_after_s)

    # --- operators -----------------------------------------------------------

    async def abandon(self, campaign_id: int, reason: str = "abandoned by operator",
                      operator: str | None = None) -> int:
        """Stop a campaign for good; returns its new generation."""
        return await self._scalar_as(int, "abandon", campaign_id=campaign_id, reason=reason,
                                  operator=operator)

    async def reopen(self, campaign_id: int, operator: str | None = None,
                     extra_attempts: int | None = None) -> int:
        """Give an exhausted campaign more attempts."""
        return await self._scalar_as(int, "reopen", campaign_id=campaign_id, operator=operator,
                                  extra_attempts=extra_attempts)

    async def approve(self, campaign_id: int, operator: str, reason: str | None = None) -> ApprovalDecision:
        """Approve a candidate that awaits approval: its promotion is requested
        (``IllegalTransition`` unless it awaits one; ``SameIdentity`` for the
        identity that made the attempt). An identical retry returns the same."""
        rows = await self._call("approve", campaign_id=campaign_id, operator=operator, reason=reason)
        return ApprovalDecision.model_validate(rows[0])

    async def deny(self, campaign_id: int, operator: str, reason: str, *,
                   abandon: bool = False) -> ApprovalDecision:
        """Deny it: back to ready with ``reason`` shown to the next attempt as a
        rejection (its approach refused), or abandoned. An identical retry
        returns the same."""
        rows = await self._call("deny", campaign_id=campaign_id, operator=operator, reason=reason,
                                abandon=abandon)
        return ApprovalDecision.model_validate(rows[0])

    async def set_limit(self, key: str, *, max_leased: int | None = None,
                        max_verifying: int | None = None, max_cost_per_day: float | None = None,
                        weight: int = 1, operator: str | None = None) -> None:
        """Set a limit key's caps (``None`` lifts one); journaled with the operator."""
        await self._call("set_limit", key=key, max_leased=max_leased, max_verifying=max_verifying,
                         max_cost_per_day=max_cost_per_day, weight=weight, operator=operator)

    async def set_bucket(self, resource: str, *, requests_per_minute: float | None = None,
                         tokens_per_minute: float | None = None, operator: str | None = None) -> None:
        """Set a resource's rates (``None``: not limited); journaled with the operator."""
        await self._call("set_bucket", resource=resource, requests_per_minute=requests_per_minute,
                         tokens_per_minute=tokens_per_minute, operator=operator)

    async def set_class_limits(self, name: str, *, limit_keys: Sequence[str] = (),
                               resources: Sequence[str] = (), max_cost: float | None = None,
                               fair_key: str | None = None, operator: str | None = None) -> None:
        """Set a class's key templates, resources, per-campaign budget and the
        key template its claims are fair across (open campaigns follow at once)."""
        args: dict[str, Any] = {"class": name, "limit_keys": list(limit_keys),
                                "resources": list(resources), "max_cost": max_cost, "fair_key": fair_key,
                                "operator": operator}
        await self._call("set_class_limits", **args)

    async def raise_budget(self, campaign_id: int, max_cost: float, *, operator: str | None = None,
                           reason: str | None = None) -> str:
        """Raise a campaign's budget above what it spent; a budget_exhausted one
        goes back to ready. Returns its state."""
        return await self._scalar_as(str, "raise_budget", campaign_id=campaign_id, max_cost=max_cost,
                                     operator=operator, reason=reason)

    async def register_class(self, name: str, **settings: Any) -> None:
        """Create or update a campaign class (see ``ledger_api.register_class``)."""
        await self._call("register_class", name=name, **settings)

    async def trim_journal(self, older_than_s: float) -> int:
        """Delete journal deltas of campaigns closed longer ago than ``older_than_s``."""
        return await self._scalar_as(int, "trim_journal", older_than_s=older_than_s)

    async def retry_now(self, campaign_id: int, operator: str | None = None) -> int:
        """Skip the rest of a ready campaign's backoff (a journaled operator
        event, not a transition); returns the event's seq. ``IllegalTransition``
        unless the campaign is ready and still waiting."""
        return await self._scalar_as(int, "retry_now", campaign_id=campaign_id, operator=operator)

    async def pause_class(self, name: str, reason: str | None = None,
                          operator: str | None = None) -> ClassPause:
        """Pause a class: claims skip it, attempts in flight finish (journaled
        in the class's own journal with ``operator``); ``NotFound`` if it is
        not registered."""
        rows = await self._call("pause_class", name=name, reason=reason, operator=operator)
        return ClassPause.model_validate(rows[0])

    async def resume_class(self, name: str, operator: str | None = None) -> ClassPause:
        """Resume a paused class (journaled); claimable again at once."""
        rows = await self._call("resume_class", name=name, operator=operator)
        return ClassPause.model_validate(rows[0])

    # --- the registry of processes (each role reports itself) -----------------

    async def _report(self, function: str, report: ProcessReport) -> datetime:
        args = report.model_dump(exclude={"holds"})
        return await self._scalar_as(datetime, function, holds=Jsonb(report.holds), **args)

    async def report_sensor_process(self, report: ProcessReport) -> datetime:
        """A sensor process says it is alive and what it holds (``ledger.runtime.registry``)."""
        return await self._report("report_sensor_process", report)

    async def report_worker_process(self, report: ProcessReport) -> datetime:
        """A worker process says it is alive and what it holds (``ledger.runtime.registry``)."""
        return await self._report("report_worker_process", report)

    async def report_reaper_process(self, report: ProcessReport) -> datetime:
        """A reaper says it is alive (``ledger.runtime.registry``)."""
        return await self._report("report_reaper_process", report)

    async def report_verifier_process(self, report: ProcessReport) -> datetime:
        """A verifier says it is alive and what it holds (``ledger.runtime.registry``)."""
        return await self._report("report_verifier_process", report)

    async def report_dispatcher_process(self, report: ProcessReport) -> datetime:
        """A dispatcher says it is alive and what it holds (``ledger.runtime.registry``)."""
        return await self._report("report_dispatcher_process", report)

    async def report_operator_process(self, report: ProcessReport) -> datetime:
        """An operator-role service (the trimmer) says it is alive (``ledger.runtime.registry``)."""
        return await self._report("report_operator_process", report)

    # --- the HTTP server's sign-ins and bulk jobs (operator role) -------------

    async def start_web_session(self, id_digest: str, token_name: str, token_role: str,
                                token_digest: str, csrf: str, ttl_s: float) -> datetime:
        """Record a dashboard sign-in; returns when it expires."""
        return await self._scalar_as(datetime, "start_web_session", id_digest=id_digest,
                                     token_name=token_name, token_role=token_role,
                                     token_digest=token_digest, csrf=csrf, ttl_s=ttl_s)

    async def web_session(self, id_digest: str) -> dict[str, Any] | None:
        """The live sign-in of a session id's digest (token name, role, digest,
        CSRF token, expiry), or ``None`` if signed out, expired or unknown."""
        rows = await self._call("web_session", _idempotent=True, id_digest=id_digest)
        return rows[0] if rows else None

    async def end_web_sessions(self, id_digest: str, everywhere: bool = False) -> int:
        """Sign out this session (or every session of its token); how many ended."""
        return await self._scalar_as(int, "end_web_sessions", _idempotent=True,
                                     id_digest=id_digest, everywhere=everywhere)

    async def start_bulk_job(self, job_id: str, selection: str, operator: str, action: str,
                             campaign_ids: Sequence[int], details: Mapping[str, Any]) -> str:
        """Begin a confirmed bulk action; ``InvalidInput`` if its selection was used."""
        return await self._scalar_as(str, "start_bulk_job", job_id=job_id, selection=selection,
                                     operator=operator, action=action,
                                     campaign_ids=list(campaign_ids), details=dict(details))

    async def record_bulk_item(self, job_id: str, campaign_id: int, outcome: str) -> None:
        """What became of one campaign of a bulk job."""
        await self._call("record_bulk_item", _idempotent=True, job_id=job_id,
                         campaign_id=campaign_id, outcome=outcome)

    async def finish_bulk_job(self, job_id: str, state: str) -> None:
        """A bulk job ended (``done`` or ``failed``)."""
        await self._call("finish_bulk_job", _idempotent=True, job_id=job_id, state=state)

    async def bulk_job(self, job_id: str) -> dict[str, Any] | None:
        """A bulk job's progress (its items once it has ended), or ``None``."""
        rows = await self._call("bulk_job", _idempotent=True, job_id=job_id)
        return rows[0] if rows else None

    async def server_secret(self, name: str) -> str:
        """The server's own secret ``name`` (64 hex digits), made on first use."""
        return await self._scalar_as(str, "server_secret", _idempotent=True, name=name)
