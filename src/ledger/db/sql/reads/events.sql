-- Reads of ledger_api.events, the journal (see campaigns.sql for the conventions).

-- name: events
-- The journal after a cursor, in seq order, a page at a time.
SELECT * FROM ledger_api.events
 WHERE campaign_id = %(campaign_id)s::bigint AND seq > %(after)s::bigint
 ORDER BY seq
 LIMIT %(limit)s::bigint;

-- name: recent_events
-- The last limit journal events of a campaign, newest first (the page shows
-- them oldest first, then follows the stream from the newest seq).
SELECT * FROM ledger_api.events
 WHERE campaign_id = %(campaign_id)s::bigint
 ORDER BY seq DESC
 LIMIT %(limit)s::bigint;

-- name: generation_events
-- What one lease (generation) wrote to the journal: an attempt's log.
SELECT * FROM ledger_api.events
 WHERE campaign_id = %(campaign_id)s::bigint AND generation = %(generation)s::bigint
 ORDER BY seq
 LIMIT %(limit)s::bigint;

-- name: transitions_of
-- A campaign's state changes, in order (the timeline's state band); at most
-- limit of them (a campaign's transitions are bounded by its attempt budget).
SELECT * FROM ledger_api.events
 WHERE campaign_id = %(campaign_id)s::bigint AND type = 'transition'
 ORDER BY seq
 LIMIT %(limit)s::bigint;

-- name: transition_counts
-- Every transition ever made, by name (a counter: the journal's transitions
-- are never trimmed). A full pass over the journal's transition rows: fine at
-- the scale Ledger is built for; past it, a counters table kept
-- by the journal trigger would make this O(transitions).
SELECT payload ->> 'transition' AS transition, count(*) AS count
  FROM ledger_api.events
 WHERE type = 'transition' AND payload ->> 'transition' IS NOT NULL
 GROUP BY 1
 ORDER BY 1;

-- name: daily_activity
-- Per UTC day over the last days days: what the ledger did, and how much of
-- it a human did. A day is "exercised" when some campaign was open during it;
-- a day with nothing to do must never read as a success.
WITH days AS (
    SELECT generate_series(date_trunc('day', statement_timestamp() AT TIME ZONE 'UTC')
                               - (%(days)s::integer - 1) * interval '1 day',
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
 ORDER BY d.day;

-- name: activity
-- Per bucket of bucket_s seconds over the last buckets buckets (oldest first,
-- every bucket present; buckets start at whole multiples of bucket_s since
-- 2000-01-01 UTC, so an hour's bucket is the clock's hour), for one class or
-- all (class NULL): campaigns opened and closed and claims (from the
-- journal's transitions), how long a claimed campaign had waited since it
-- became ready (backoff included: the journal has no separate "due" event),
-- attempts ended and their duration, verdicts. Percentiles are NULL in a
-- bucket with nothing to measure. The journal is read by created_at (its
-- campaign_event_recent index), transitions only.
WITH hours AS (
    SELECT generate_series(date_bin(make_interval(secs => %(bucket_s)s::integer),
                                    statement_timestamp(), TIMESTAMPTZ '2000-01-01 00:00:00+00')
                               - (%(buckets)s::integer - 1)
                                 * make_interval(secs => %(bucket_s)s::integer),
                           date_bin(make_interval(secs => %(bucket_s)s::integer),
                                    statement_timestamp(), TIMESTAMPTZ '2000-01-01 00:00:00+00'),
                           make_interval(secs => %(bucket_s)s::integer)) AS hour
), moves AS (
    SELECT date_bin(make_interval(secs => %(bucket_s)s::integer), e.created_at,
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
       AND (%(class)s::text IS NULL OR c.class = %(class)s::text)
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
    SELECT date_bin(make_interval(secs => %(bucket_s)s::integer), a.ended_at,
                    TIMESTAMPTZ '2000-01-01 00:00:00+00') AS hour, count(*) AS attempts_ended,
           percentile_cont(0.5) WITHIN GROUP (
               ORDER BY extract(epoch FROM a.ended_at - a.claimed_at)) AS duration_p50,
           percentile_cont(0.95) WITHIN GROUP (
               ORDER BY extract(epoch FROM a.ended_at - a.claimed_at)) AS duration_p95
      FROM ledger_api.attempts a
      JOIN ledger_api.campaigns c ON c.id = a.campaign_id
     WHERE a.ended_at >= (SELECT min(hour) FROM hours)
       AND (%(class)s::text IS NULL OR c.class = %(class)s::text)
     GROUP BY 1
), verdicts AS (
    SELECT date_bin(make_interval(secs => %(bucket_s)s::integer), v.finished_at,
                    TIMESTAMPTZ '2000-01-01 00:00:00+00') AS hour,
           count(*) FILTER (WHERE v.status = 'accepted') AS accepted,
           count(*) FILTER (WHERE v.status = 'rejected') AS rejected
      FROM ledger_api.verifications v
      JOIN ledger_api.campaigns c ON c.id = v.campaign_id
     WHERE v.finished_at >= (SELECT min(hour) FROM hours)
       AND (%(class)s::text IS NULL OR c.class = %(class)s::text)
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
 ORDER BY h.hour;
