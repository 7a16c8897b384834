"""Every read Ledger makes, in one place.

The tables here are the *read views* of schema ``ledger_api`` (the raw tables in
``ledger`` are owner-only). Statements are built with SQLAlchemy Core and
compiled once, at import, to psycopg's ``%(name)s`` form; ``ledger.database``
runs them. Writes are never here: they are kernel functions (src/ledger/sql).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    and_,
    any_,
    bindparam,
    func,
    literal_column,
    or_,
    select,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.sql import Select

from .query_text import Query

# (SQLAlchemy's dialect constructors are not annotated.)
_dialect = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
metadata = MetaData(schema="ledger_api")
TS = DateTime(timezone=True)


def compile_query(stmt: Select[Any]) -> Query:
    """Compile a Core statement to psycopg's parameter style."""
    compiled = stmt.compile(dialect=_dialect)
    return Query(str(compiled), dict(compiled.params))


campaigns = Table(
    "campaigns", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("class", Text), Column("objective_key", Text), Column("target", Text),
    Column("desired_state", JSONB), Column("opening_observation", JSONB), Column("state", Text),
    Column("lease_owner", Text), Column("leased_at", TS), Column("lease_expires_at", TS),
    Column("generation", BigInteger), Column("attempt_count", Integer),
    Column("max_attempts", Integer), Column("next_attempt_at", TS),
    Column("last_failure_reason", Text), Column("acceptance_criteria", JSONB),
    Column("evidence_location", Text), Column("seat", Text), Column("priority", Integer),
    Column("labels", ARRAY(Text)), Column("event_seq", BigInteger),
    Column("promoted_at", TS), Column("promoted_sha", Text),
    Column("created_at", TS), Column("updated_at", TS), Column("closed_at", TS),
    Column("waiting_on", Text), Column("waiting_reason", Text), Column("waiting_since", TS),
    Column("fault_count", Integer), Column("trace_context", JSONB),
)

attempts = Table(
    "attempts", metadata,
    Column("id", BigInteger, primary_key=True), Column("campaign_id", BigInteger),
    Column("attempt_no", Integer), Column("generation", BigInteger), Column("worker", Text),
    Column("claimed_at", TS), Column("lease_expires_at", TS), Column("last_heartbeat_at", TS),
    Column("heartbeat_count", Integer), Column("outcome", Text), Column("verdict", Text),
    Column("ended_at", TS), Column("failure_reason", Text), Column("fingerprint", Text),
    Column("base_sha", Text), Column("candidate_sha", Text), Column("bundle", JSONB),
    Column("bundle_digest", Text), Column("log_tail", Text), Column("candidate_ref", Text),
    Column("diff_bytes", Integer),
)

events = Table(
    "events", metadata,
    Column("campaign_id", BigInteger, primary_key=True), Column("seq", BigInteger, primary_key=True),
    Column("type", Text), Column("actor", Text), Column("generation", BigInteger),
    Column("delta", Boolean), Column("payload", JSONB), Column("created_at", TS),
    Column("actor_role", Text),
)

observations = Table(
    "observations", metadata,
    Column("id", BigInteger, primary_key=True), Column("sensor", Text), Column("target", Text),
    Column("objective_key", Text), Column("class", Text), Column("status", Text),
    Column("started_at", TS), Column("finished_at", TS), Column("tick", TS),
    Column("details", JSONB), Column("campaign_id", BigInteger), Column("effect", Text),
    Column("idempotency_key", Text), Column("recorded_at", TS), Column("reason", Text),
)

verifications = Table(
    "verifications", metadata,
    Column("id", BigInteger, primary_key=True), Column("campaign_id", BigInteger),
    Column("attempt_id", BigInteger), Column("generation", BigInteger), Column("verifier", Text),
    Column("model_family", Text), Column("status", Text), Column("claimed_at", TS),
    Column("lease_expires_at", TS), Column("finished_at", TS), Column("reason", Text),
    Column("evidence", JSONB), Column("kind", Text),
)

side_effects = Table(
    "side_effects", metadata,
    Column("id", BigInteger, primary_key=True), Column("campaign_id", BigInteger),
    Column("generation", BigInteger), Column("kind", Text), Column("purpose", Text),
    Column("target", Text), Column("precondition", JSONB), Column("payload", JSONB),
    Column("idempotency_key", Text), Column("requested_by", Text), Column("requested_role", Text),
    Column("state", Text), Column("claimed_by", Text), Column("lease_expires_at", TS),
    Column("tries", Integer), Column("next_try_at", TS), Column("result", JSONB),
    Column("error", Text), Column("created_at", TS), Column("updated_at", TS),
    Column("finished_at", TS),
)

security_events = Table(
    "security_events", metadata,
    Column("id", BigInteger, primary_key=True), Column("at", TS), Column("actor_role", Text),
    Column("actor", Text), Column("campaign_id", BigInteger), Column("action", Text),
    Column("target", Text), Column("reason", Text), Column("details", JSONB),
)

classes = Table(
    "classes", metadata,
    Column("name", Text, primary_key=True), Column("max_attempts", Integer),
    Column("lease_seconds", Float), Column("backoff_base_s", Float), Column("backoff_factor", Float),
    Column("backoff_cap_s", Float), Column("backoff_jitter", Float), Column("seat_policy", Text),
    Column("authority", JSONB), Column("acceptance", JSONB), Column("promotion", JSONB),
    Column("verifier", Text), Column("created_at", TS), Column("updated_at", TS),
    Column("weight", Integer), Column("heartbeat_seconds", Float), Column("paused_at", TS),
    Column("verifiers", ARRAY(Text)),
)

attempt_diffs = Table(
    "attempt_diffs", metadata,
    Column("campaign_id", BigInteger), Column("attempt_no", Integer),
    Column("generation", BigInteger), Column("candidate_ref", Text), Column("diff", LargeBinary),
)

class_events = Table(
    "class_events", metadata,
    Column("id", BigInteger, primary_key=True), Column("class", Text), Column("type", Text),
    Column("actor", Text), Column("actor_role", Text), Column("reason", Text),
    Column("created_at", TS),
)

processes = Table(
    "processes", metadata,
    Column("role", Text), Column("host", Text), Column("pid", Integer), Column("started_at", TS),
    Column("identity", Text), Column("service", Text), Column("interval_s", Float),
    Column("holds", JSONB), Column("last_seen", TS), Column("stopped_at", TS),
    Column("status", Text),
)

states = Table(
    "states", metadata,
    Column("name", Text, primary_key=True), Column("is_terminal", Boolean),
    Column("position", Integer), Column("description", Text),
)

transitions = Table(
    "transitions", metadata,
    Column("name", Text), Column("from_state", Text), Column("to_state", Text),
    Column("owner_role", Text), Column("db_role", Text), Column("note", Text),
)

# --- single campaign -------------------------------------------------------

CAMPAIGN = compile_query(select(campaigns).where(campaigns.c.id == bindparam("id")))

# The trace context a campaign was opened with (ledger.tracing), and that of
# the campaign open for an objective (at most one: campaign_one_open_per_objective).
TRACE_CONTEXT = compile_query(
    select(campaigns.c.trace_context).where(campaigns.c.id == bindparam("id")))

OPEN_TRACE_CONTEXT = compile_query(
    select(campaigns.c.id, campaigns.c.trace_context)
    .where(campaigns.c.objective_key == bindparam("objective_key"),
           # literals, as the partial unique index says it, so the index answers
           campaigns.c.state.not_in([literal_column(f"'{state}'")
                                     for state in ("confirmed", "dismissed", "abandoned")]))
    .limit(1)
)

CAMPAIGN_ATTEMPTS = compile_query(
    select(attempts).where(attempts.c.campaign_id == bindparam("campaign_id"))
    .order_by(attempts.c.attempt_no)
)

GENERATION_ATTEMPT = compile_query(
    select(attempts).where(attempts.c.campaign_id == bindparam("campaign_id"),
                           attempts.c.generation == bindparam("generation"))
)

# A worker's live leases, in the shape of a claim. The lease length is left at
# 0: a read is no renewal, so the adopting worker confirms the lease (a
# heartbeat) before it trusts it (ledger.lease).
RUNNING_CLAIMS = compile_query(
    select(campaigns.c.id.label("campaign_id"), campaigns.c.generation, attempts.c.attempt_no,
           campaigns.c.lease_expires_at, campaigns.c["class"], campaigns.c.objective_key,
           campaigns.c.target, campaigns.c.desired_state, campaigns.c.opening_observation,
           campaigns.c.acceptance_criteria, campaigns.c.attempt_count, campaigns.c.max_attempts,
           literal_column("0.0").label("lease_remaining_s"))
    .join(attempts, and_(attempts.c.campaign_id == campaigns.c.id,
                         attempts.c.generation == campaigns.c.generation))
    .where(campaigns.c.state == "leased", campaigns.c.lease_owner == bindparam("worker"),
           attempts.c.outcome == "running")
    .order_by(campaigns.c.id)
)

CAMPAIGN_VERIFICATIONS = compile_query(
    select(verifications).where(verifications.c.campaign_id == bindparam("campaign_id"))
    .order_by(verifications.c.id)
)

CAMPAIGN_SIDE_EFFECTS = compile_query(
    select(side_effects).where(side_effects.c.campaign_id == bindparam("campaign_id"))
    .order_by(side_effects.c.id)
)

CAMPAIGN_OBSERVATIONS = compile_query(
    select(observations).where(observations.c.campaign_id == bindparam("campaign_id"))
    .order_by(observations.c.id)
)

# The journal after a cursor, in seq order, a page at a time.
EVENTS_AFTER = compile_query(
    select(events)
    .where(events.c.campaign_id == bindparam("campaign_id"), events.c.seq > bindparam("after"))
    .order_by(events.c.seq)
    .limit(bindparam("limit"))
)

# --- many campaigns --------------------------------------------------------


def _list_campaigns() -> Select[Any]:
    # Every filter is optional: a NULL parameter disables it, so one compiled
    # statement serves every combination. Order (updated_at DESC, id DESC) is
    # total, so the (updated_at, id) cursor is deterministic.
    p = {name: bindparam(name, type_=typ) for name, typ in (
        ("states", ARRAY(Text)), ("classes", ARRAY(Text)), ("target", Text),
        ("objective_key", Text), ("label", Text), ("updated_since", TS),
        ("cursor_updated_at", TS), ("cursor_id", BigInteger), ("search", Text),
        ("ids", ARRAY(BigInteger)),
    )}
    c = campaigns.c
    return (
        select(campaigns)
        .where(
            or_(p["states"].is_(None), c.state == any_(p["states"])),
            or_(p["classes"].is_(None), c["class"] == any_(p["classes"])),
            or_(p["target"].is_(None), c.target == p["target"]),
            or_(p["objective_key"].is_(None), c.objective_key == p["objective_key"]),
            or_(p["label"].is_(None), p["label"] == any_(c.labels)),
            or_(p["updated_since"].is_(None), c.updated_at >= p["updated_since"]),
            or_(p["search"].is_(None), c.objective_key.icontains(p["search"], autoescape=False)),
            or_(p["ids"].is_(None), c.id == any_(p["ids"])),
            or_(
                p["cursor_id"].is_(None),
                c.updated_at < p["cursor_updated_at"],
                and_(c.updated_at == p["cursor_updated_at"], c.id < p["cursor_id"]),
            ),
        )
        .order_by(c.updated_at.desc(), c.id.desc())
        .limit(bindparam("limit"))
    )


CAMPAIGNS_PAGE = compile_query(_list_campaigns())
LIST_DEFAULTS: dict[str, Any] = {
    "states": None, "classes": None, "target": None, "objective_key": None, "label": None,
    "updated_since": None, "cursor_updated_at": None, "cursor_id": None, "search": None,
    "ids": None,
}

STATE_COUNTS = compile_query(
    select(states.c.name.label("state"), states.c.is_terminal,
           func.count(campaigns.c.id).label("count"))
    .select_from(states.outerjoin(campaigns, campaigns.c.state == states.c.name))
    .group_by(states.c.name, states.c.is_terminal, states.c.position)
    .order_by(states.c.position)
)

#: The share of the server's notification queue in use (0..1): it grows while
#: a session LISTENs but does not read (issue 15).
NOTIFY_QUEUE_USAGE = Query("SELECT pg_catalog.pg_notification_queue_usage() AS usage")

OLDEST_READY = compile_query(
    select(func.min(campaigns.c.created_at).label("oldest"))
    .where(campaigns.c.state == "ready")
)

# --- the contract ----------------------------------------------------------

STATES = compile_query(select(states).order_by(states.c.position))
TRANSITIONS = compile_query(
    select(transitions).order_by(transitions.c.name, transitions.c.from_state.nulls_first())
)
CLASSES = compile_query(select(classes).order_by(classes.c.name))
CLASS = compile_query(select(classes).where(classes.c.name == bindparam("name")))

SECURITY_EVENTS = compile_query(
    select(security_events)
    .where(or_(bindparam("campaign_id", type_=BigInteger).is_(None),
               security_events.c.campaign_id == bindparam("campaign_id", type_=BigInteger)))
    .order_by(security_events.c.id)
)

# --- autonomy ------------------------------------------------------------------

# Per UTC day over the last :days days: what the ledger did, and how much of it a
# human did. A day is "exercised" when some campaign was open during it; a day
# with nothing to do must never read as a success.
_DAILY_ACTIVITY = text("""
WITH days AS (
    SELECT generate_series(date_trunc('day', statement_timestamp() AT TIME ZONE 'UTC')
                               - (CAST(:days AS integer) - 1) * interval '1 day',
                           date_trunc('day', statement_timestamp() AT TIME ZONE 'UTC'),
                           interval '1 day') AS day
), moves AS (
    SELECT date_trunc('day', e.created_at AT TIME ZONE 'UTC') AS day,
           e.payload ->> 'transition' AS name,
           -- human: whatever an operator's role did (API, dashboard or CLI),
           -- decided by the role that acted, never by the actor's name
           e.actor_role IS NOT DISTINCT FROM 'operator' AS human
      FROM ledger_api.events e
     WHERE (e.type = 'transition' OR e.actor_role = 'operator')
       AND e.created_at >= (SELECT min(day) FROM days) AT TIME ZONE 'UTC'
    UNION ALL
    -- what operators did to a class (pause, resume: class_event.sql): human too
    SELECT date_trunc('day', ce.created_at AT TIME ZONE 'UTC'), NULL, ce.actor_role = 'operator'
      FROM ledger_api.class_events ce
     WHERE ce.created_at >= (SELECT min(day) FROM days) AT TIME ZONE 'UTC'
)
SELECT CAST(d.day AS date) AS day,
       count(m.name) FILTER (WHERE m.name = 'open') AS opened,
       count(m.name) FILTER (WHERE m.name = 'claim') AS attempts,
       count(m.name) FILTER (WHERE m.name = 'reject') AS rejections,
       count(m.name) FILTER (WHERE m.name = 'accept') AS verified,
       count(m.name) FILTER (WHERE m.name = 'confirm') AS confirmed,
       count(*) FILTER (WHERE m.human) AS human_actions,
       EXISTS (SELECT 1 FROM ledger_api.campaigns c
                WHERE c.created_at < (d.day + interval '1 day') AT TIME ZONE 'UTC'
                  AND (c.closed_at IS NULL OR c.closed_at >= d.day AT TIME ZONE 'UTC')) AS exercised
  FROM days d LEFT JOIN moves m ON m.day = d.day
 GROUP BY d.day
 ORDER BY d.day
""")
DAILY_ACTIVITY = Query(str(_DAILY_ACTIVITY.compile(dialect=_dialect)), {})

# --- the HTTP API: one observation, leases, metrics ---------------------------
# Metrics are computed from the rows at scrape time, so every process reports the
# same numbers and a restart loses nothing. Counters come from rows that only
# ever grow (the journal's transitions are never trimmed; attempts, verifications
# and side effects are never deleted), so they are monotonic as Prometheus needs.

OBSERVATION = compile_query(select(observations).where(observations.c.id == bindparam("id")))

# Leased campaigns whose lease runs out within :within_s seconds (by the
# database's clock, the one that judges leases), soonest first.
LEASES_EXPIRING = compile_query(
    select(campaigns)
    .where(campaigns.c.state == "leased",
           campaigns.c.lease_expires_at <= func.statement_timestamp()
           + func.make_interval(0, 0, 0, 0, 0, 0, bindparam("within_s", type_=Float)))
    .order_by(campaigns.c.lease_expires_at, campaigns.c.id)
    .limit(bindparam("limit"))
)

# Seconds the oldest ready campaign has existed, by the database's clock (NULL:
# nothing is ready). Same campaign as OLDEST_READY.
OLDEST_READY_AGE = compile_query(
    select(func.extract("epoch", func.statement_timestamp() - func.min(campaigns.c.created_at))
           .cast(Float).label("age_s"))
    .where(campaigns.c.state == "ready")
)

# Every transition ever made, by name. A full pass over the journal's transition
# rows: fine for the scale in DESIGN.md section 4; past it, a counters table kept
# by the journal trigger would make this O(transitions).
# (A subquery, so GROUP BY names a column: the same ->> expression bound twice
# would be two different parameters to the server.)
_transitions = (
    select(events.c.payload["transition"].astext.label("transition"))
    .where(events.c.type == "transition")
    .subquery("t")
)
TRANSITION_COUNTS = compile_query(
    select(_transitions.c.transition, func.count().label("count"))
    .where(_transitions.c.transition.is_not(None))
    .group_by(_transitions.c.transition)
    .order_by(_transitions.c.transition)
)

ATTEMPT_OUTCOMES = compile_query(
    select(attempts.c.outcome, func.count().label("count"))
    .group_by(attempts.c.outcome).order_by(attempts.c.outcome)
)

VERIFICATION_OUTCOMES = compile_query(
    select(verifications.c.status, func.count().label("count"))
    .group_by(verifications.c.status).order_by(verifications.c.status)
)

SIDE_EFFECT_COUNTS = compile_query(
    select(side_effects.c.kind, side_effects.c.state, func.count().label("count"))
    .group_by(side_effects.c.kind, side_effects.c.state)
    .order_by(side_effects.c.kind, side_effects.c.state)
)


def _duration_histogram(start: Any, end: Any) -> Query:
    # One row per upper bound in :bounds (ascending; the caller appends +Inf):
    # how many finished rows took at most that long, and their summed seconds --
    # a Prometheus histogram's cumulative buckets. The LEFT JOIN keeps every
    # bound when nothing has finished yet (count 0).
    seconds = func.extract("epoch", end - start).cast(Float)
    finished = select(seconds.label("s")).where(end.is_not(None)).subquery("d")
    bounds = func.unnest(bindparam("bounds", type_=ARRAY(Float))).table_valued("le").render_derived()
    le = bounds.c.le
    return compile_query(
        select(le.label("le"),
               func.count(finished.c.s).filter(finished.c.s <= le).label("count"),
               func.coalesce(func.sum(finished.c.s).filter(finished.c.s <= le), 0.0)
               .label("sum"))
        .select_from(bounds.outerjoin(finished, literal_column("true")))
        .group_by(le)
        .order_by(le)
    )


ATTEMPT_DURATIONS = _duration_histogram(attempts.c.claimed_at, attempts.c.ended_at)
VERIFICATION_DURATIONS = _duration_histogram(verifications.c.claimed_at,
                                             verifications.c.finished_at)

# --- the dashboard (ledger.api.dashboard) ---------------------------------------

# What the board shows changes when this does: a campaign opened (count) or
# moved -- a claim or an abandon bumps its generation, an ending or a reopen
# its attempt count or budget, and every state change its state, summed as a
# hash weighted by the row (so two moves cannot cancel out) -- or a new
# observation, or a class paused or resumed. Not a journal append, a lease
# renewal or any other touch of updated_at: an attempt streaming output or
# heartbeating changes nothing the board shows, and must not make every open
# board re-render (issue 30). One pass over the campaign rows (about 1 ms for
# 10,000, the sums over event_seq it replaced cost the same); the board's
# event stream runs it on a wake-up or a poll tick, never per event.
_c = campaigns.c
BOARD_VERSION = compile_query(
    select(
        func.count(_c.id).label("campaigns"),
        func.sum(_c.generation).label("generations"),
        func.sum(_c.attempt_count).label("attempts"),
        func.sum(_c.max_attempts).label("budgets"),
        func.sum(func.hashtext(_c.state).cast(BigInteger) * (_c.id % 65521 + 1)).label("states"),
        select(func.max(observations.c.id)).scalar_subquery().label("observation_id"),
        select(func.max(class_events.c.id)).scalar_subquery().label("class_event_id"),
    )
)

# Campaigns per state among those a board filter matches: the list's filters
# (states, classes, target, label, search ...), without its order and page.
_matching = _list_campaigns().order_by(None).limit(None).subquery("matching")
MATCHING_STATE_COUNTS = compile_query(
    select(_matching.c.state, func.count().label("count"))
    .group_by(_matching.c.state)
    .order_by(_matching.c.state)
)

# Each sensor's latest observation and latest claimed tick. Sensor names are
# found by a skip scan (one index probe per distinct sensor on
# observation_by_sensor and the sensor_tick key), so the cost follows the number
# of sensors, not of observations; :limit bounds both the scan and the answer.
_SENSOR_LATEST = text("""
WITH RECURSIVE observed(sensor, n) AS (
    (SELECT o.sensor, 1 FROM ledger_api.observations o ORDER BY o.sensor LIMIT 1)
    UNION ALL
    SELECT (SELECT o.sensor FROM ledger_api.observations o
             WHERE o.sensor > observed.sensor ORDER BY o.sensor LIMIT 1), observed.n + 1
      FROM observed
     WHERE observed.sensor IS NOT NULL AND observed.n < CAST(:limit AS integer)
), ticked(sensor, n) AS (
    (SELECT t.sensor, 1 FROM ledger_api.sensor_ticks t ORDER BY t.sensor LIMIT 1)
    UNION ALL
    SELECT (SELECT t.sensor FROM ledger_api.sensor_ticks t
             WHERE t.sensor > ticked.sensor ORDER BY t.sensor LIMIT 1), ticked.n + 1
      FROM ticked
     WHERE ticked.sensor IS NOT NULL AND ticked.n < CAST(:limit AS integer)
), names AS (
    SELECT sensor FROM observed WHERE sensor IS NOT NULL
    UNION
    SELECT sensor FROM ticked WHERE sensor IS NOT NULL
)
SELECT n.sensor, o.id AS observation_id, o.target, o.objective_key, o.status, o.effect,
       o.campaign_id, o.started_at, o.finished_at, o.recorded_at,
       t.tick AS last_tick, t.claimed_by AS tick_claimed_by, t.claimed_at AS tick_claimed_at
  FROM names n
  LEFT JOIN LATERAL (SELECT * FROM ledger_api.observations o
                      WHERE o.sensor = n.sensor ORDER BY o.id DESC LIMIT 1) o ON true
  LEFT JOIN LATERAL (SELECT * FROM ledger_api.sensor_ticks t
                      WHERE t.sensor = n.sensor ORDER BY t.tick DESC LIMIT 1) t ON true
 ORDER BY n.sensor
 LIMIT CAST(:limit AS integer)
""")
SENSOR_LATEST = Query(str(_SENSOR_LATEST.compile(dialect=_dialect)), {})

# A campaign's state changes, in order (the timeline's state band); at most
# :limit of them (a campaign's transitions are bounded by its attempt budget).
CAMPAIGN_TRANSITIONS = compile_query(
    select(events)
    .where(events.c.campaign_id == bindparam("campaign_id"), events.c.type == "transition")
    .order_by(events.c.seq)
    .limit(bindparam("limit"))
)

# The last :limit journal events of a campaign, newest first (the page shows
# them oldest first, then follows the stream from the newest seq).
RECENT_EVENTS = compile_query(
    select(events)
    .where(events.c.campaign_id == bindparam("campaign_id"))
    .order_by(events.c.seq.desc())
    .limit(bindparam("limit"))
)

# What one lease (generation) wrote to the journal: an attempt's log.
GENERATION_EVENTS = compile_query(
    select(events)
    .where(events.c.campaign_id == bindparam("campaign_id"),
           events.c.generation == bindparam("generation"))
    .order_by(events.c.seq)
    .limit(bindparam("limit"))
)

# A campaign's latest observations, newest first (a long-open campaign watched
# every few seconds has thousands; the page shows the latest).
RECENT_CAMPAIGN_OBSERVATIONS = compile_query(
    select(observations)
    .where(observations.c.campaign_id == bindparam("campaign_id"))
    .order_by(observations.c.id.desc())
    .limit(bindparam("limit"))
)

# --- the operator's surface: summaries, charts, the per-class view -------------

# Campaigns per (class, state): the class label of the ledger_campaigns gauge
# and the per-class view's counts. Served by campaign_by_class_state.
CLASS_STATE_COUNTS = compile_query(
    select(campaigns.c["class"].label("class"), campaigns.c.state,
           func.count().label("count"))
    .group_by(campaigns.c["class"], campaigns.c.state)
    .order_by(campaigns.c["class"], campaigns.c.state)
)

# Campaigns held back by what is not their attempt's own, per (class, reason:
# system_fault or target), with how long the oldest has waited by the
# database's clock: the ledger_campaigns_waiting gauge and /readyz. Served by
# campaign_waiting (partial: only waiting rows).
WAITING_COUNTS = compile_query(
    select(campaigns.c["class"].label("class"), campaigns.c.waiting_on.label("reason"),
           func.count().label("count"),
           func.extract("epoch", func.statement_timestamp() - func.min(campaigns.c.waiting_since))
           .label("oldest_s"))
    .where(campaigns.c.waiting_on.is_not(None))
    .group_by(campaigns.c["class"], campaigns.c.waiting_on)
    .order_by(campaigns.c["class"], campaigns.c.waiting_on)
)


def _at_risk(c: Any, cls: Any) -> Any:
    # A lease at risk: expired, or its last renewal is overdue -- a heartbeat
    # renews it to the class's full lease, so the time since the last renewal
    # is the lease's length less what remains, and a healthy holder renews
    # every heartbeat (the class's heartbeat_seconds; a third of the lease when
    # unknown). Half a heartbeat late is overdue; a lease that is short by
    # design is not at risk.
    remaining = func.extract("epoch", c.c.lease_expires_at - func.statement_timestamp())
    heartbeat = func.coalesce(cls.c.heartbeat_seconds, cls.c.lease_seconds / 3)
    return and_(c.c.state == "leased",
                or_(remaining <= 0, cls.c.lease_seconds - remaining > 1.5 * heartbeat))


# The board's summary cards under a filter: the oldest ready campaign's age and
# the leases at risk (below), among what the filter matches (same filters as
# CAMPAIGNS_PAGE), by the database's clock.
MATCHING_SUMMARY = compile_query(
    select(
        func.extract("epoch", func.statement_timestamp()
                     - func.min(_matching.c.created_at).filter(_matching.c.state == "ready"))
        .cast(Float).label("oldest_ready_age_s"),
        func.count().filter(_at_risk(_matching, classes)).label("at_risk"),
    )
    .select_from(_matching.outerjoin(classes, classes.c.name == _matching.c["class"]))
)

# Leased campaigns whose lease is at risk (as above), soonest expiry first.
LEASES_AT_RISK = compile_query(
    select(campaigns)
    .select_from(campaigns.join(classes, classes.c.name == campaigns.c["class"]))
    .where(_at_risk(campaigns, classes))
    .order_by(campaigns.c.lease_expires_at, campaigns.c.id)
    .limit(bindparam("limit"))
)

# Per bucket of :bucket_s seconds over the last :buckets buckets (oldest first,
# every bucket present; buckets start at whole multiples of :bucket_s since
# 2000-01-01 UTC, so an hour's bucket is the clock's hour), for one class or
# all (:class NULL): campaigns opened and closed and claims (from
# the journal's transitions), how long a claimed campaign had waited since it
# became ready (backoff included: the journal has no separate "due" event),
# attempts ended and their duration, verdicts. Percentiles are NULL in an hour
# with nothing to measure. The journal is read by created_at (its
# campaign_event_recent index), transitions only.
_ACTIVITY = text("""
WITH hours AS (
    SELECT generate_series(date_bin(make_interval(secs => CAST(:bucket_s AS integer)),
                                    statement_timestamp(), TIMESTAMPTZ '2000-01-01 00:00:00+00')
                               - (CAST(:buckets AS integer) - 1)
                                 * make_interval(secs => CAST(:bucket_s AS integer)),
                           date_bin(make_interval(secs => CAST(:bucket_s AS integer)),
                                    statement_timestamp(), TIMESTAMPTZ '2000-01-01 00:00:00+00'),
                           make_interval(secs => CAST(:bucket_s AS integer))) AS hour
), moves AS (
    SELECT date_bin(make_interval(secs => CAST(:bucket_s AS integer)), e.created_at,
                    TIMESTAMPTZ '2000-01-01 00:00:00+00') AS hour,
           e.payload ->> 'transition' AS name,
           e.payload ->> 'to' AS to_state,
           extract(epoch FROM e.created_at - ready.created_at) AS wait_s
      FROM ledger_api.events e
      JOIN ledger_api.campaigns c ON c.id = e.campaign_id
      -- a claim's wait: since the transition before it (the one that made the
      -- campaign ready), one backward probe of the journal's key per claim
      LEFT JOIN LATERAL (
          SELECT p.created_at FROM ledger_api.events p
           WHERE e.payload ->> 'transition' = 'claim'
             AND p.campaign_id = e.campaign_id AND p.seq < e.seq AND p.type = 'transition'
           ORDER BY p.seq DESC LIMIT 1) ready ON true
     WHERE e.type = 'transition'
       AND (CAST(:class AS text) IS NULL OR c.class = CAST(:class AS text))
       AND e.created_at >= (SELECT min(hour) FROM hours)
), journal AS (
    SELECT m.hour,
           count(*) FILTER (WHERE m.name = 'open') AS opened,
           count(*) FILTER (WHERE m.to_state IN ('confirmed', 'dismissed', 'abandoned')) AS closed,
           count(*) FILTER (WHERE m.name = 'claim') AS claims,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY m.wait_s) AS wait_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY m.wait_s) AS wait_p95
      FROM moves m
     GROUP BY m.hour
), ended AS (
    SELECT date_bin(make_interval(secs => CAST(:bucket_s AS integer)), a.ended_at,
                    TIMESTAMPTZ '2000-01-01 00:00:00+00') AS hour, count(*) AS attempts_ended,
           percentile_cont(0.5) WITHIN GROUP (
               ORDER BY extract(epoch FROM a.ended_at - a.claimed_at)) AS duration_p50,
           percentile_cont(0.95) WITHIN GROUP (
               ORDER BY extract(epoch FROM a.ended_at - a.claimed_at)) AS duration_p95
      FROM ledger_api.attempts a
      JOIN ledger_api.campaigns c ON c.id = a.campaign_id
     WHERE a.ended_at >= (SELECT min(hour) FROM hours)
       AND (CAST(:class AS text) IS NULL OR c.class = CAST(:class AS text))
     GROUP BY 1
), verdicts AS (
    SELECT date_bin(make_interval(secs => CAST(:bucket_s AS integer)), v.finished_at,
                    TIMESTAMPTZ '2000-01-01 00:00:00+00') AS hour,
           count(*) FILTER (WHERE v.status = 'accepted') AS accepted,
           count(*) FILTER (WHERE v.status = 'rejected') AS rejected
      FROM ledger_api.verifications v
      JOIN ledger_api.campaigns c ON c.id = v.campaign_id
     WHERE v.finished_at >= (SELECT min(hour) FROM hours)
       AND (CAST(:class AS text) IS NULL OR c.class = CAST(:class AS text))
     GROUP BY 1
)
SELECT h.hour,
       coalesce(j.opened, 0) AS opened, coalesce(j.closed, 0) AS closed,
       coalesce(j.claims, 0) AS claims, j.wait_p50, j.wait_p95,
       coalesce(e.attempts_ended, 0) AS attempts_ended, e.duration_p50, e.duration_p95,
       coalesce(v.accepted, 0) AS accepted, coalesce(v.rejected, 0) AS rejected
  FROM hours h
  LEFT JOIN journal j ON j.hour = h.hour
  LEFT JOIN ended e ON e.hour = h.hour
  LEFT JOIN verdicts v ON v.hour = h.hour
 ORDER BY h.hour
""")
ACTIVITY = Query(str(_ACTIVITY.compile(dialect=_dialect)), {})

# One class at a glance: how long its confirmed campaigns took from open to
# confirm over the last :days days (p50, p95), and its oldest ready campaign.
_CLASS_SUMMARY = text("""
SELECT (SELECT count(*) FROM ledger_api.campaigns c
         WHERE c.class = CAST(:class AS text) AND c.state = 'confirmed'
           AND c.closed_at >= statement_timestamp() - make_interval(days => CAST(:days AS integer)))
           AS confirmed,
       (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM c.closed_at - c.created_at))
          FROM ledger_api.campaigns c
         WHERE c.class = CAST(:class AS text) AND c.state = 'confirmed'
           AND c.closed_at >= statement_timestamp() - make_interval(days => CAST(:days AS integer)))
           AS confirm_p50_s,
       (SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM c.closed_at - c.created_at))
          FROM ledger_api.campaigns c
         WHERE c.class = CAST(:class AS text) AND c.state = 'confirmed'
           AND c.closed_at >= statement_timestamp() - make_interval(days => CAST(:days AS integer)))
           AS confirm_p95_s,
       (SELECT extract(epoch FROM statement_timestamp() - min(c.created_at))
          FROM ledger_api.campaigns c
         WHERE c.class = CAST(:class AS text) AND c.state = 'ready') AS oldest_ready_age_s
""")
CLASS_SUMMARY = Query(str(_CLASS_SUMMARY.compile(dialect=_dialect)), {})


# --- operator controls: the registry of processes, a class's journal, diffs -----

# Every process of the registry (at most :limit): the live first, by role,
# then host and pid; the gone and the stopped after them.
PROCESSES = compile_query(
    select(processes)
    .order_by((processes.c.status == "live").desc(), processes.c.role, processes.c.host,
              processes.c.pid, processes.c.started_at.desc())
    .limit(bindparam("limit"))
)

# What operators did to a class, newest first.
CLASS_EVENTS = compile_query(
    select(class_events)
    .where(class_events.c["class"] == bindparam("class"))
    .order_by(class_events.c.id.desc())
    .limit(bindparam("limit"))
)

# One attempt's candidate diff: its size and its first :cap bytes (the page
# shows a bounded head of a diff of up to 64 MiB).
ATTEMPT_DIFF = compile_query(
    select(attempt_diffs.c.campaign_id, attempt_diffs.c.attempt_no, attempt_diffs.c.generation,
           attempt_diffs.c.candidate_ref,
           func.octet_length(attempt_diffs.c.diff).label("bytes"),
           func.substring(attempt_diffs.c.diff, 1, bindparam("cap", type_=Integer)).label("head"))
    .where(attempt_diffs.c.campaign_id == bindparam("campaign_id"),
           attempt_diffs.c.attempt_no == bindparam("attempt_no"))
)
