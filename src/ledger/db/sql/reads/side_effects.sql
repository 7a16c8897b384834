-- Reads of ledger_api.side_effects (see campaigns.sql for the conventions).

-- name: side_effects_of
SELECT * FROM ledger_api.side_effects WHERE campaign_id = %(campaign_id)s::bigint ORDER BY id;

-- name: side_effect_counts
-- Side effects per (kind, state); never deleted, so a counter.
SELECT kind, state, count(*) AS count
  FROM ledger_api.side_effects
 GROUP BY kind, state
 ORDER BY kind, state;
