-- Reads of ledger_api.attempts and ledger_api.attempt_diffs (see campaigns.sql
-- for the conventions).

-- name: attempt_of
-- The attempt a lease (generation) of a campaign made, if any: how a holder
-- whose reply was lost learns how its attempt ended.
SELECT * FROM ledger_api.attempts
 WHERE campaign_id = %(campaign_id)s::bigint AND generation = %(generation)s::bigint;

-- name: attempts_of
SELECT * FROM ledger_api.attempts WHERE campaign_id = %(campaign_id)s::bigint ORDER BY attempt_no;

-- name: attempt_outcomes
-- Metrics are computed from the rows at scrape time, so every process reports
-- the same numbers and a restart loses nothing. Attempts are never deleted, so
-- the counts only grow, as Prometheus counters must.
SELECT outcome, count(*) AS count FROM ledger_api.attempts GROUP BY outcome ORDER BY outcome;

-- name: attempt_durations
-- One row per upper bound in bounds (ascending; the caller appends +Inf): how
-- many finished attempts took at most that long, and their summed seconds --
-- a Prometheus histogram's cumulative buckets. The LEFT JOIN keeps every bound
-- when nothing has finished yet (count 0).
SELECT b.le AS le,
       count(d.s) FILTER (WHERE d.s <= b.le) AS count,
       coalesce(sum(d.s) FILTER (WHERE d.s <= b.le), 0.0::float8) AS sum
  FROM unnest(%(bounds)s::float8[]) AS b(le)
  LEFT JOIN (SELECT extract(epoch FROM a.ended_at - a.claimed_at)::float8 AS s
               FROM ledger_api.attempts a
              WHERE a.ended_at IS NOT NULL) AS d ON true
 GROUP BY b.le
 ORDER BY b.le;

-- name: attempt_diff
-- One attempt's candidate diff: its size and its first cap bytes (the page
-- shows a bounded head of a diff of up to 64 MiB).
SELECT campaign_id, attempt_no, generation, candidate_ref,
       octet_length(diff) AS bytes,
       substring(diff FROM 1 FOR %(cap)s::integer) AS head
  FROM ledger_api.attempt_diffs
 WHERE campaign_id = %(campaign_id)s::bigint AND attempt_no = %(attempt_no)s::integer;
