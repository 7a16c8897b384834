-- Reads of ledger_api.verifications (see campaigns.sql for the conventions).

-- name: verifications_of
SELECT * FROM ledger_api.verifications WHERE campaign_id = %(campaign_id)s::bigint ORDER BY id;

-- name: verification_outcomes
-- Verifications per status (running included); never deleted, so a counter.
SELECT status, count(*) AS count FROM ledger_api.verifications GROUP BY status ORDER BY status;

-- name: verification_durations
-- As attempt_durations, from a verification's claim to its verdict.
SELECT b.le AS le,
       count(d.s) FILTER (WHERE d.s <= b.le) AS count,
       coalesce(sum(d.s) FILTER (WHERE d.s <= b.le), 0.0::float8) AS sum
  FROM unnest(%(bounds)s::float8[]) AS b(le)
  LEFT JOIN (SELECT extract(epoch FROM v.finished_at - v.claimed_at)::float8 AS s
               FROM ledger_api.verifications v
              WHERE v.finished_at IS NOT NULL) AS d ON true
 GROUP BY b.le
 ORDER BY b.le;
