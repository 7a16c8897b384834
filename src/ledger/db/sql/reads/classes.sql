-- Reads of ledger_api.classes and ledger_api.class_events (see campaigns.sql
-- for the conventions).

-- name: classes
SELECT * FROM ledger_api.classes ORDER BY name;

-- name: campaign_class
SELECT * FROM ledger_api.classes WHERE name = %(name)s::text;

-- name: class_events
-- What operators did to a class (pause, resume), newest first.
SELECT * FROM ledger_api.class_events
 WHERE class = %(class)s::text
 ORDER BY id DESC
 LIMIT %(limit)s::bigint;

-- name: class_summary
-- One class at a glance (no row: not registered): its campaigns per state
-- (states with none left out, by name), how long its confirmed campaigns took
-- from open to confirm over the last days days (p50, p95), and its oldest
-- ready campaign's age.
WITH confirmed AS (
    SELECT extract(epoch FROM c.closed_at - c.created_at) AS s
      FROM ledger_api.campaigns c
     WHERE c.class = %(class)s::text AND c.state = 'confirmed'
       AND c.closed_at >= statement_timestamp() - make_interval(days => %(days)s::integer)
)
SELECT k.name,
       (SELECT coalesce(json_object_agg(n.state, n.count ORDER BY n.state), '{}')
          FROM (SELECT c.state, count(*) AS count FROM ledger_api.campaigns c
                 WHERE c.class = k.name GROUP BY c.state) n) AS states,
       (SELECT count(*) FROM confirmed) AS confirmed,
       (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s) FROM confirmed) AS confirm_p50_s,
       (SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY s) FROM confirmed) AS confirm_p95_s,
       (SELECT extract(epoch FROM statement_timestamp() - min(c.created_at))
          FROM ledger_api.campaigns c
         WHERE c.class = k.name AND c.state = 'ready') AS oldest_ready_age_s
  FROM ledger_api.classes k
 WHERE k.name = %(class)s::text;
