"""What anyone may read: one typed method per named read query, same names.

``Reads`` is the read side of the kernel client (``ledger.db.kernel.Kernel``
mirrors the write functions of ``ledger_api``; ``Reads`` mirrors the named
queries of ``src/ledger/db/sql/reads/``, ``ledger.db.named_queries``): one campaign,
its attempts, journal and observations, pages of campaigns, the classes, and
the figures the dashboard, the metrics and the autonomy report show. It works
for every role, since every role may read the views; the runtimes use it to
read back what a write whose reply was lost did.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ledger.db.database import Executor
from ledger.db.models import (
    Approval,
    ApprovalBacklog,
    Attempt,
    AttemptDiff,
    AttemptUsage,
    Campaign,
    CampaignClass,
    CampaignDetail,
    Claim,
    ClassEvent,
    ClassSummary,
    ClassUsage,
    Event,
    HourActivity,
    LimitBucket,
    LimitEvent,
    LimitKey,
    LimitWaiting,
    Observation,
    ProcessRow,
    SecurityEvent,
    SensorSummary,
    SideEffect,
    StateRow,
    TransitionRow,
    Verification,
    WaitingApproval,
)
from ledger.db.named_queries import QUERIES as Q
from ledger.errors import InvalidInput, NotFound

#: The methods made of other reads (each of those a named query), not a query
#: of their own; every other public method runs the named query of its name.
COMPOSED = frozenset({"campaign_detail"})


def _filters(*, states: Sequence[str] | None = None, classes: Sequence[str] | None = None,
             target: str | None = None, objective_key: str | None = None,
             label: str | None = None, updated_since: datetime | None = None,
             search: str | None = None, ids: Sequence[int] | None = None,
             cursor: tuple[datetime, int] | None = None) -> dict[str, Any]:
    """The parameters of the campaign filter (``campaigns``, ``matching_*``):
    each one unset is NULL, which disables it in the SQL. ``search`` is a
    literal substring of the objective key: its ``%``, ``_`` and ``\\`` are
    escaped for ILIKE (whose escape character is the backslash)."""
    return {
        "states": list(states) if states else None,
        "classes": list(classes) if classes else None,
        "target": target, "objective_key": objective_key, "label": label,
        "updated_since": updated_since, "search": _literal(search) if search is not None else None,
        "ids": list(ids) if ids else None,
        "cursor_updated_at": cursor[0] if cursor else None,
        "cursor_id": cursor[1] if cursor else None,
    }


def _literal(text: str) -> str:
    """``text`` as an ILIKE pattern that matches itself only."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class Reads:
    """Typed reads over ``executor`` (a session, or an open transaction)."""

    def __init__(self, executor: Executor):
        self.executor = executor

    # --- campaigns, journals, classes --------------------------------------------

    async def campaign(self, campaign_id: int) -> Campaign:
        """One campaign; ``NotFound`` if there is none."""
        rows = await self.executor.fetch(Q["campaign"], id=campaign_id)
        if not rows:
            raise NotFound(f"campaign {campaign_id} does not exist")
        return Campaign.model_validate(rows[0])

    async def trace_context(self, campaign_id: int) -> dict[str, str] | None:
        """The W3C trace context campaign ``campaign_id`` was opened with
        (``None``: opened untraced, or no such campaign)."""
        rows = await self.executor.fetch(Q["trace_context"], id=campaign_id)
        return rows[0]["trace_context"] if rows else None

    async def open_trace_context(self, objective_key: str) -> tuple[int, dict[str, str] | None] | None:
        """The campaign open for ``objective_key`` and its trace context; ``None`` if none is open."""
        rows = await self.executor.fetch(Q["open_trace_context"], objective_key=objective_key)
        return (rows[0]["id"], rows[0]["trace_context"]) if rows else None

    async def attempt_of(self, campaign_id: int, generation: int) -> Attempt | None:
        """The attempt a lease (generation) of a campaign made, if any: how a
        holder whose reply was lost learns how its attempt ended."""
        rows = await self.executor.fetch(Q["attempt_of"], campaign_id=campaign_id,
                                         generation=generation)
        return Attempt.model_validate(rows[0]) if rows else None

    async def running_claims(self, worker: str) -> list[Claim]:
        """Leases ``worker`` holds now, as claims: how a worker whose claim's
        reply was lost finds (and adopts) what it was granted."""
        rows = await self.executor.fetch(Q["running_claims"], worker=worker)
        return [Claim.model_validate(r) for r in rows]

    async def campaign_detail(self, campaign_id: int) -> CampaignDetail:
        """A campaign with its attempts, verifications, side effects and
        observations (the one read made of others: each list is read by its
        own query, so every value is loaded by the tolerant loaders of
        ``ledger.db.stored``, as the rows of any other read)."""
        return CampaignDetail(
            campaign=await self.campaign(campaign_id),
            attempts=await self.attempts_of(campaign_id),
            verifications=await self.verifications_of(campaign_id),
            side_effects=await self.side_effects_of(campaign_id),
            observations=await self.observations_of(campaign_id),
            approvals=await self.approvals_of(campaign_id),
        )

    async def events(self, campaign_id: int, after: int = 0, limit: int = 1000) -> list[Event]:
        """Journal events with ``seq > after``, in order."""
        rows = await self.executor.fetch(Q["events"], campaign_id=campaign_id,
                                         after=after, limit=limit)
        return [Event.model_validate(r) for r in rows]

    async def campaigns(self, *, states: Sequence[str] | None = None,
                        classes: Sequence[str] | None = None, target: str | None = None,
                        objective_key: str | None = None, label: str | None = None,
                        updated_since: datetime | None = None, search: str | None = None,
                        cursor: tuple[datetime, int] | None = None,
                        limit: int = 100, ids: Sequence[int] | None = None) -> list[Campaign]:
        """A page of campaigns, newest change first; pass the last row's
        ``(updated_at, id)`` as ``cursor`` for the next page. ``ids`` narrows
        to those campaigns (rows picked on the board)."""
        params = _filters(states=states, classes=classes, target=target,
                          objective_key=objective_key, label=label, updated_since=updated_since,
                          search=search, ids=ids, cursor=cursor)
        rows = await self.executor.fetch(Q["campaigns"], limit=limit, **params)
        return [Campaign.model_validate(r) for r in rows]

    async def state_counts(self) -> dict[str, int]:
        """Campaigns per state (every state, zero included), in machine order."""
        rows = await self.executor.fetch(Q["state_counts"])
        return {r["state"]: r["count"] for r in rows}

    async def oldest_ready(self) -> datetime | None:
        """When the longest-waiting ready campaign was opened."""
        rows = await self.executor.fetch(Q["oldest_ready"])
        return rows[0]["oldest"] if rows else None

    async def daily_activity(self, days: int) -> list[dict[str, Any]]:
        """Per-day counts for the autonomy report (see ``ledger.report``)."""
        if not 1 <= days <= 366:
            raise InvalidInput("the report covers 1 to 366 days")
        return await self.executor.fetch(Q["daily_activity"], days=days)

    async def states(self) -> list[StateRow]:
        """The states of the machine, from the database."""
        return [StateRow.model_validate(r) for r in await self.executor.fetch(Q["states"])]

    async def transitions(self) -> list[TransitionRow]:
        """The legal transitions, from the database."""
        return [TransitionRow.model_validate(r)
                for r in await self.executor.fetch(Q["transitions"])]

    async def classes(self) -> list[CampaignClass]:
        """Registered campaign classes."""
        return [CampaignClass.model_validate(r) for r in await self.executor.fetch(Q["classes"])]

    async def campaign_class(self, name: str) -> CampaignClass:
        """One registered class; ``NotFound`` if there is none."""
        rows = await self.executor.fetch(Q["campaign_class"], name=name)
        if not rows:
            raise NotFound(f"campaign class {name} is not registered")
        return CampaignClass.model_validate(rows[0])

    async def security_events(self, campaign_id: int | None = None) -> list[SecurityEvent]:
        """Refused writes (of one campaign, or all)."""
        rows = await self.executor.fetch(Q["security_events"], campaign_id=campaign_id)
        return [SecurityEvent.model_validate(r) for r in rows]

    # --- reads for the HTTP API and metrics -----------------------------------

    async def observation(self, observation_id: int) -> Observation:
        """One observation; ``NotFound`` if there is none."""
        rows = await self.executor.fetch(Q["observation"], id=observation_id)
        if not rows:
            raise NotFound(f"observation {observation_id} does not exist")
        return Observation.model_validate(rows[0])

    async def leases_expiring(self, within_s: float, limit: int = 100) -> list[Campaign]:
        """Leased campaigns whose lease ends within ``within_s`` seconds (or has ended)."""
        rows = await self.executor.fetch(Q["leases_expiring"], within_s=within_s, limit=limit)
        return [Campaign.model_validate(r) for r in rows]

    async def notify_queue_usage(self) -> float:
        """The share (0..1) of the server's notification queue in use."""
        rows = await self.executor.fetch(Q["notify_queue_usage"])
        return float(rows[0]["usage"])

    async def oldest_ready_age(self) -> float | None:
        """Seconds since the oldest ready campaign was opened, by the database's clock."""
        rows = await self.executor.fetch(Q["oldest_ready_age"])
        return rows[0]["age_s"] if rows else None

    async def transition_counts(self) -> dict[str, int]:
        """How often each transition has happened, from the journal."""
        rows = await self.executor.fetch(Q["transition_counts"])
        return {r["transition"]: r["count"] for r in rows}

    async def attempt_outcomes(self) -> dict[str, int]:
        """Attempts per outcome (``running`` included)."""
        rows = await self.executor.fetch(Q["attempt_outcomes"])
        return {r["outcome"]: r["count"] for r in rows}

    async def verification_outcomes(self) -> dict[str, int]:
        """Verifications per status (``running`` included)."""
        rows = await self.executor.fetch(Q["verification_outcomes"])
        return {r["status"]: r["count"] for r in rows}

    async def side_effect_counts(self) -> dict[tuple[str, str], int]:
        """Side effects per ``(kind, state)``."""
        rows = await self.executor.fetch(Q["side_effect_counts"])
        return {(r["kind"], r["state"]): r["count"] for r in rows}

    async def attempt_durations(self, bounds: Sequence[float]) -> list[tuple[float, int, float]]:
        """Cumulative ``(le, count, sum_s)`` of finished attempts, a
        Prometheus histogram's buckets; the last bound is ``+inf``."""
        return await self._histogram("attempt_durations", bounds)

    async def verification_durations(self, bounds: Sequence[float]
                                     ) -> list[tuple[float, int, float]]:
        """As ``attempt_durations``, of finished verifications."""
        return await self._histogram("verification_durations", bounds)

    async def _histogram(self, name: str, bounds: Sequence[float]) -> list[tuple[float, int, float]]:
        les = sorted({float(b) for b in bounds if b != float("inf")}) + [float("inf")]
        rows = await self.executor.fetch(Q[name], bounds=les)
        return [(r["le"], r["count"], r["sum"]) for r in rows]

    # --- reads for the dashboard ------------------------------------------------

    async def board_version(self) -> tuple[Any, ...]:
        """A value that changes whenever what the board shows may have changed
        (a campaign opened or moved, an observation, a class paused or
        resumed) -- not on output, progress or lease renewals; compare, don't read."""
        rows = await self.executor.fetch(Q["board_version"])
        row = rows[0]
        return (row["campaigns"], row["generations"], row["attempts"], row["budgets"], row["states"],
                row["observation_id"], row["class_event_id"])

    async def matching_state_counts(self, *, states: Sequence[str] | None = None,
                                    classes: Sequence[str] | None = None,
                                    target: str | None = None, label: str | None = None,
                                    search: str | None = None,
                                    ids: Sequence[int] | None = None) -> dict[str, int]:
        """Campaigns per state among those the filters match (same filters as
        ``campaigns``); states with none are left out."""
        params = _filters(states=states, classes=classes, target=target, label=label,
                          search=search, ids=ids)
        rows = await self.executor.fetch(Q["matching_state_counts"], **params)
        return {r["state"]: r["count"] for r in rows}

    async def sensor_summaries(self, limit: int = 50) -> list[SensorSummary]:
        """Per sensor (by name, at most ``limit``): its latest observation and its
        latest claimed tick, its errors in a row and its latest error."""
        if not 1 <= limit <= 1000:
            raise InvalidInput("between 1 and 1000 sensors")
        rows = await self.executor.fetch(Q["sensor_summaries"], limit=limit)
        return [SensorSummary.model_validate(r) for r in rows]

    async def sensor_outcome_counts(self) -> dict[tuple[str, str], int]:
        """Observations recorded per (sensor, outcome): green, red or error."""
        rows = await self.executor.fetch(Q["sensor_outcome_counts"])
        return {(r["sensor"], r["outcome"]): r["count"] for r in rows}

    async def transitions_of(self, campaign_id: int, limit: int = 1000) -> list[Event]:
        """A campaign's state changes, oldest first."""
        rows = await self.executor.fetch(Q["transitions_of"], campaign_id=campaign_id,
                                         limit=limit)
        return [Event.model_validate(r) for r in rows]

    async def recent_events(self, campaign_id: int, limit: int = 100) -> list[Event]:
        """The last ``limit`` journal events of a campaign, oldest first."""
        rows = await self.executor.fetch(Q["recent_events"], campaign_id=campaign_id,
                                         limit=limit)
        return [Event.model_validate(r) for r in reversed(rows)]

    async def generation_events(self, campaign_id: int, generation: int,
                                limit: int = 5000) -> list[Event]:
        """What one lease (generation) of a campaign journaled, in order: its attempt's log."""
        rows = await self.executor.fetch(Q["generation_events"], campaign_id=campaign_id,
                                         generation=generation, limit=limit)
        return [Event.model_validate(r) for r in rows]

    async def observations_of(self, campaign_id: int) -> list[Observation]:
        """A campaign's observations, in order."""
        rows = await self.executor.fetch(Q["observations_of"], campaign_id=campaign_id)
        return [Observation.model_validate(r) for r in rows]

    async def recent_observations(self, campaign_id: int, limit: int = 200) -> list[Observation]:
        """A campaign's latest ``limit`` observations, oldest first."""
        rows = await self.executor.fetch(Q["recent_observations"],
                                         campaign_id=campaign_id, limit=limit)
        return [Observation.model_validate(r) for r in reversed(rows)]

    async def attempts_of(self, campaign_id: int) -> list[Attempt]:
        """A campaign's attempts, in order (``campaign_detail`` without the rest)."""
        rows = await self.executor.fetch(Q["attempts_of"], campaign_id=campaign_id)
        return [Attempt.model_validate(r) for r in rows]

    async def verifications_of(self, campaign_id: int) -> list[Verification]:
        """A campaign's verifications, in order."""
        rows = await self.executor.fetch(Q["verifications_of"], campaign_id=campaign_id)
        return [Verification.model_validate(r) for r in rows]

    async def side_effects_of(self, campaign_id: int) -> list[SideEffect]:
        """A campaign's side effects, in order."""
        rows = await self.executor.fetch(Q["side_effects_of"], campaign_id=campaign_id)
        return [SideEffect.model_validate(r) for r in rows]

    # --- approvals --------------------------------------------------------------

    async def approvals_of(self, campaign_id: int) -> list[Approval]:
        """A campaign's approvals (asked for, and how each was decided), oldest first."""
        rows = await self.executor.fetch(Q["approvals_of"], campaign_id=campaign_id)
        return [Approval.model_validate(r) for r in rows]

    async def approvals_waiting(self, class_: str | None = None, limit: int = 100) -> list[WaitingApproval]:
        """The approvals no one has decided yet (of one class, or all), oldest first."""
        rows = await self.executor.fetch(Q["approvals_waiting"], **{"class": class_}, limit=limit)
        return [WaitingApproval.model_validate(r) for r in rows]

    async def approval_backlog(self) -> list[ApprovalBacklog]:
        """Per class with any: the undecided approvals and the oldest one's age."""
        rows = await self.executor.fetch(Q["approval_backlog"])
        return [ApprovalBacklog.model_validate(r) for r in rows]

    async def approval_decisions(self) -> dict[tuple[str, str], int]:
        """Decided approvals per ``(decision, role that decided)``."""
        rows = await self.executor.fetch(Q["approval_decisions"])
        return {(r["decision"], r["decided_role"]): r["count"] for r in rows}

    # --- the operator's class view and charts ------------------------------------

    async def class_state_counts(self) -> dict[tuple[str, str], int]:
        """Campaigns per ``(class, state)``; pairs with none are left out."""
        rows = await self.executor.fetch(Q["class_state_counts"])
        return {(r["class"], r["state"]): r["count"] for r in rows}

    async def waiting_counts(self) -> dict[tuple[str, str], tuple[int, float]]:
        """Campaigns waiting on what is not their attempt's own, per ``(class,
        reason)`` (``system_fault`` or ``target``): how many, and how long the
        oldest of them has waited (seconds)."""
        rows = await self.executor.fetch(Q["waiting_counts"])
        return {(r["class"], r["reason"]): (r["count"], float(r["oldest_s"] or 0.0)) for r in rows}

    async def matching_summary(self, *, states: Sequence[str] | None = None,
                               classes: Sequence[str] | None = None,
                               target: str | None = None, label: str | None = None,
                               search: str | None = None,
                               ids: Sequence[int] | None = None) -> tuple[float | None, int]:
        """Among the campaigns the filters match (as ``campaigns``): the oldest
        ready one's age in seconds, and how many leases are at risk (expired,
        or overdue a heartbeat of their class: ``leases_at_risk``)."""
        params = _filters(states=states, classes=classes, target=target, label=label,
                          search=search, ids=ids)
        row = (await self.executor.fetch(Q["matching_summary"], **params))[0]
        return row["oldest_ready_age_s"], row["at_risk"]

    async def leases_at_risk(self, limit: int = 100) -> list[Campaign]:
        """Leases at risk, soonest expiry first: expired, or whose last renewal
        is overdue by half a heartbeat of their class (a lease that is short by
        design, renewed on time, is not)."""
        rows = await self.executor.fetch(Q["leases_at_risk"], limit=limit)
        return [Campaign.model_validate(r) for r in rows]

    async def activity(self, buckets: int, bucket_s: int, class_: str | None = None
                       ) -> list[HourActivity]:
        """Throughput and latency per bucket of ``bucket_s`` seconds over the
        last ``buckets`` of them (oldest first; ``hour`` is each bucket's start)."""
        if not 1 <= buckets <= 1000 or not 10 <= bucket_s <= 86400:
            raise InvalidInput("1 to 1000 buckets of 10 s to a day")
        rows = await self.executor.fetch(Q["activity"], buckets=buckets, bucket_s=bucket_s,
                                         **{"class": class_})
        return [HourActivity.model_validate(r) for r in rows]

    # --- operator controls ---------------------------------------------------------

    async def processes(self, limit: int = 500) -> list[ProcessRow]:
        """The registry of processes (``ledger.runtime.registry``): the live first."""
        rows = await self.executor.fetch(Q["processes"], limit=limit)
        return [ProcessRow.model_validate(r) for r in rows]

    async def processes_not_ready(self, limit: int = 100) -> list[ProcessRow]:
        """The live processes that wait to start, and why (``ProcessRow.not_ready``)."""
        rows = await self.executor.fetch(Q["processes_not_ready"], limit=limit)
        return [ProcessRow.model_validate(r) for r in rows]

    async def limit_keys(self) -> list[LimitKey]:
        """Every limit key: its caps, its use, today's spend."""
        return [LimitKey.model_validate(r) for r in await self.executor.fetch(Q["limit_keys"])]

    async def limit_buckets(self) -> list[LimitBucket]:
        """Every rate-limited resource: its rates, what it gave out, the wait now."""
        return [LimitBucket.model_validate(r) for r in await self.executor.fetch(Q["limit_buckets"])]

    async def limit_events(self, limit: int = 50) -> list[LimitEvent]:
        """Changes of the limits, newest first (who set what)."""
        return [LimitEvent.model_validate(r) for r in await self.executor.fetch(Q["limit_events"], limit=limit)]

    async def campaign_usage(self, campaign_id: int) -> list[AttemptUsage]:
        """What each attempt of a campaign reported it used."""
        rows = await self.executor.fetch(Q["campaign_usage"], campaign_id=campaign_id)
        return [AttemptUsage.model_validate(r) for r in rows]

    async def usage_by_class(self) -> list[ClassUsage]:
        """Usage per class, in all and today (UTC)."""
        return [ClassUsage.model_validate(r) for r in await self.executor.fetch(Q["usage_by_class"])]

    async def limits_waiting(self) -> list[LimitWaiting]:
        """How many ready campaigns of each class wait on each kind of limit."""
        return [LimitWaiting.model_validate(r) for r in await self.executor.fetch(Q["limits_waiting"])]

    async def class_events(self, name: str, limit: int = 20) -> list[ClassEvent]:
        """What operators did to a class (pause, resume), newest first."""
        rows = await self.executor.fetch(Q["class_events"], limit=limit, **{"class": name})
        return [ClassEvent.model_validate(r) for r in rows]

    async def attempt_diff(self, campaign_id: int, attempt_no: int,
                           cap: int = 256 * 1024) -> AttemptDiff | None:
        """The candidate diff an attempt recorded (at most ``cap`` bytes of it,
        decoded; ``truncated`` says whether there is more), or ``None``."""
        if not 1 <= cap <= 64 * 1024 * 1024:
            raise InvalidInput("a diff is read 1 byte to 64 MiB at a time")
        rows = await self.executor.fetch(Q["attempt_diff"], campaign_id=campaign_id,
                                         attempt_no=attempt_no, cap=cap)
        if not rows:
            return None
        row = rows[0]
        head = bytes(row["head"] or b"")
        return AttemptDiff(campaign_id=row["campaign_id"], attempt_no=row["attempt_no"],
                           generation=row["generation"], candidate_ref=row["candidate_ref"],
                           bytes=row["bytes"], text=head.decode("utf-8", errors="replace"),
                           truncated=row["bytes"] > len(head))

    async def class_summary(self, name: str, days: int = 7) -> ClassSummary:
        """One class: campaigns per state, open-to-confirm percentiles over the
        last ``days``, its oldest ready campaign; ``NotFound`` if not registered."""
        if not 1 <= days <= 366:
            raise InvalidInput("between 1 and 366 days")
        rows = await self.executor.fetch(Q["class_summary"], days=days, **{"class": name})
        if not rows:
            raise NotFound(f"campaign class {name} is not registered")
        return ClassSummary(days=days, **rows[0])
