-- Reads of ledger_api.campaigns: one campaign, pages of them, and the
-- figures the board, the metrics and /readyz show. Each query is a method of
-- ledger.reads.Reads of the same name. Parameters are psycopg's %(name)s
-- (a literal percent sign is written %%); an optional filter is NULL when
-- unset, so one statement serves every combination.

-- name: campaign
SELECT * FROM ledger_api.campaigns WHERE id = %(id)s::bigint;

-- name: trace_context
-- The W3C trace context a campaign was opened with (no row: no such campaign).
SELECT trace_context FROM ledger_api.campaigns WHERE id = %(id)s::bigint;

-- name: open_trace_context
-- The campaign open for an objective and its trace context. The terminal
-- states are written as literals, as the partial unique index says them, so
-- the index answers.
SELECT id, trace_context FROM ledger_api.campaigns
 WHERE objective_key = %(objective_key)s::text
   AND state NOT IN ('confirmed', 'dismissed', 'abandoned')
 LIMIT 1;

-- name: running_claims
-- A worker's live leases, in the shape of a claim. The lease length is left
-- at 0: a read is no renewal, so the adopting worker confirms the lease (a
-- heartbeat) before it trusts it (ledger.lease).
SELECT c.id AS campaign_id, c.generation, a.attempt_no, c.lease_expires_at, c.class,
       c.objective_key, c.target, c.desired_state, c.opening_observation,
       c.acceptance_criteria, c.attempt_count, c.max_attempts, 0.0 AS lease_remaining_s
  FROM ledger_api.campaigns c
  JOIN ledger_api.attempts a ON a.campaign_id = c.id AND a.generation = c.generation
 WHERE c.state = 'leased' AND c.lease_owner = %(worker)s::text AND a.outcome = 'running'
 ORDER BY c.id;

-- name: campaigns
-- A page of campaigns, newest change first. The order (updated_at DESC, id
-- DESC) is total, so the (updated_at, id) cursor is deterministic. The filter
-- is the same in matching_state_counts and matching_summary (tests/test_schema.py
-- holds the three equal). search arrives escaped (Reads): a literal substring.
SELECT *
  FROM ledger_api.campaigns c
 WHERE (%(states)s::text[] IS NULL OR c.state = ANY (%(states)s::text[]))
   AND (%(classes)s::text[] IS NULL OR c.class = ANY (%(classes)s::text[]))
   AND (%(target)s::text IS NULL OR c.target = %(target)s::text)
   AND (%(objective_key)s::text IS NULL OR c.objective_key = %(objective_key)s::text)
   AND (%(label)s::text IS NULL OR %(label)s::text = ANY (c.labels))
   AND (%(updated_since)s::timestamptz IS NULL OR c.updated_at >= %(updated_since)s::timestamptz)
   AND (%(search)s::text IS NULL OR c.objective_key ILIKE '%%' || %(search)s::text || '%%')
   AND (%(ids)s::bigint[] IS NULL OR c.id = ANY (%(ids)s::bigint[]))
   AND (%(cursor_id)s::bigint IS NULL
        OR c.updated_at < %(cursor_updated_at)s::timestamptz
        OR (c.updated_at = %(cursor_updated_at)s::timestamptz AND c.id < %(cursor_id)s::bigint))
 ORDER BY c.updated_at DESC, c.id DESC
 LIMIT %(limit)s::bigint;

-- name: matching_state_counts
-- Campaigns per state among those a board filter matches (the filter of
-- campaigns, without its order and page).
SELECT c.state, count(*) AS count
  FROM ledger_api.campaigns c
 WHERE (%(states)s::text[] IS NULL OR c.state = ANY (%(states)s::text[]))
   AND (%(classes)s::text[] IS NULL OR c.class = ANY (%(classes)s::text[]))
   AND (%(target)s::text IS NULL OR c.target = %(target)s::text)
   AND (%(objective_key)s::text IS NULL OR c.objective_key = %(objective_key)s::text)
   AND (%(label)s::text IS NULL OR %(label)s::text = ANY (c.labels))
   AND (%(updated_since)s::timestamptz IS NULL OR c.updated_at >= %(updated_since)s::timestamptz)
   AND (%(search)s::text IS NULL OR c.objective_key ILIKE '%%' || %(search)s::text || '%%')
   AND (%(ids)s::bigint[] IS NULL OR c.id = ANY (%(ids)s::bigint[]))
   AND (%(cursor_id)s::bigint IS NULL
        OR c.updated_at < %(cursor_updated_at)s::timestamptz
        OR (c.updated_at = %(cursor_updated_at)s::timestamptz AND c.id < %(cursor_id)s::bigint))
 GROUP BY c.state
 ORDER BY c.state;

-- name: matching_summary
-- The board's summary cards under a filter (that of campaigns): the oldest
-- ready campaign's age and the leases at risk (as leases_at_risk), among what
-- the filter matches, by the database's clock.
SELECT extract(epoch FROM statement_timestamp()
               - min(c.created_at) FILTER (WHERE c.state = 'ready'))::float8 AS oldest_ready_age_s,
       count(*) FILTER (
           WHERE c.state = 'leased'
             AND (extract(epoch FROM c.lease_expires_at - statement_timestamp()) <= 0
                  OR k.lease_seconds - extract(epoch FROM c.lease_expires_at - statement_timestamp())
                     > 1.5 * coalesce(k.heartbeat_seconds, k.lease_seconds / 3))) AS at_risk
  FROM ledger_api.campaigns c
  LEFT JOIN ledger_api.classes k ON k.name = c.class
 WHERE (%(states)s::text[] IS NULL OR c.state = ANY (%(states)s::text[]))
   AND (%(classes)s::text[] IS NULL OR c.class = ANY (%(classes)s::text[]))
   AND (%(target)s::text IS NULL OR c.target = %(target)s::text)
   AND (%(objective_key)s::text IS NULL OR c.objective_key = %(objective_key)s::text)
   AND (%(label)s::text IS NULL OR %(label)s::text = ANY (c.labels))
   AND (%(updated_since)s::timestamptz IS NULL OR c.updated_at >= %(updated_since)s::timestamptz)
   AND (%(search)s::text IS NULL OR c.objective_key ILIKE '%%' || %(search)s::text || '%%')
   AND (%(ids)s::bigint[] IS NULL OR c.id = ANY (%(ids)s::bigint[]))
   AND (%(cursor_id)s::bigint IS NULL
        OR c.updated_at < %(cursor_updated_at)s::timestamptz
        OR (c.updated_at = %(cursor_updated_at)s::timestamptz AND c.id < %(cursor_id)s::bigint));

-- name: leases_at_risk
-- Leased campaigns whose lease is at risk, soonest expiry first: expired, or
-- its last renewal is overdue. A heartbeat renews a lease to the class's full
-- length, so the time since the last renewal is the lease's length less what
-- remains, and a healthy holder renews every heartbeat (the class's
-- heartbeat_seconds; a third of the lease when unknown). Half a heartbeat late
-- is overdue; a lease that is short by design is not at risk.
SELECT c.*
  FROM ledger_api.campaigns c
  JOIN ledger_api.classes k ON k.name = c.class
 WHERE c.state = 'leased'
   AND (extract(epoch FROM c.lease_expires_at - statement_timestamp()) <= 0
        OR k.lease_seconds - extract(epoch FROM c.lease_expires_at - statement_timestamp())
           > 1.5 * coalesce(k.heartbeat_seconds, k.lease_seconds / 3))
 ORDER BY c.lease_expires_at, c.id
 LIMIT %(limit)s::bigint;

-- name: leases_expiring
-- Leased campaigns whose lease runs out within within_s seconds (by the
-- database's clock, the one that judges leases), soonest first.
SELECT *
  FROM ledger_api.campaigns
 WHERE state = 'leased'
   AND lease_expires_at <= statement_timestamp() + make_interval(secs => %(within_s)s::float8)
 ORDER BY lease_expires_at, id
 LIMIT %(limit)s::bigint;

-- name: state_counts
-- Campaigns per state, every state (zero included), in the machine's order.
SELECT s.name AS state, s.is_terminal, count(c.id) AS count
  FROM ledger_api.states s
  LEFT JOIN ledger_api.campaigns c ON c.state = s.name
 GROUP BY s.name, s.is_terminal, s.position
 ORDER BY s.position;

-- name: oldest_ready
SELECT min(created_at) AS oldest FROM ledger_api.campaigns WHERE state = 'ready';

-- name: oldest_ready_age
-- Seconds the oldest ready campaign has existed, by the database's clock
-- (NULL: nothing is ready). The same campaign as oldest_ready.
SELECT extract(epoch FROM statement_timestamp() - min(created_at))::float8 AS age_s
  FROM ledger_api.campaigns
 WHERE state = 'ready';

-- name: class_state_counts
-- Campaigns per (class, state): the class label of the ledger_campaigns gauge
-- and the per-class view's counts. Served by campaign_by_class_state.
SELECT class, state, count(*) AS count
  FROM ledger_api.campaigns
 GROUP BY class, state
 ORDER BY class, state;

-- name: waiting_counts
-- Campaigns held back by what is not their attempt's own, per (class, reason:
-- system_fault or target), with how long the oldest has waited by the
-- database's clock: the ledger_campaigns_waiting gauge and /readyz. Served by
-- campaign_waiting (partial: only waiting rows).
SELECT class, waiting_on AS reason, count(*) AS count,
       extract(epoch FROM statement_timestamp() - min(waiting_since)) AS oldest_s
  FROM ledger_api.campaigns
 WHERE waiting_on IS NOT NULL
 GROUP BY class, waiting_on
 ORDER BY class, waiting_on;

-- name: board_version
-- What the board shows changes when this does: a campaign opened (count) or
-- moved -- a claim or an abandon bumps its generation, an ending or a reopen
-- its attempt count or budget, and every state change its state, summed as a
-- hash weighted by the row (so two moves cannot cancel out) -- or a new
-- observation, or a class paused or resumed. Not a journal append, a lease
-- renewal or any other touch of updated_at: an attempt streaming output or
-- heartbeating changes nothing the board shows, and must not make every open
-- board re-render. One pass over the campaign rows (about 1 ms for 10,000);
-- the board's event stream runs it on a wake-up or a poll tick, never per event.
SELECT count(c.id) AS campaigns,
       sum(c.generation) AS generations,
       sum(c.attempt_count) AS attempts,
       sum(c.max_attempts) AS budgets,
       sum(hashtext(c.state)::bigint * (c.id %% 65521 + 1)) AS states,
       (SELECT max(o.id) FROM ledger_api.observations o) AS observation_id,
       (SELECT max(e.id) FROM ledger_api.class_events e) AS class_event_id
  FROM ledger_api.campaigns c;
