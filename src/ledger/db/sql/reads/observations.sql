-- Reads of ledger_api.observations and ledger_api.sensor_ticks (see
-- campaigns.sql for the conventions).

-- name: observation
SELECT * FROM ledger_api.observations WHERE id = %(id)s::bigint;

-- name: observations_of
SELECT * FROM ledger_api.observations WHERE campaign_id = %(campaign_id)s::bigint ORDER BY id;

-- name: recent_observations
-- A campaign's latest observations, newest first (a long-open campaign
-- watched every few seconds has thousands; the page shows the latest).
SELECT * FROM ledger_api.observations
 WHERE campaign_id = %(campaign_id)s::bigint
 ORDER BY id DESC
 LIMIT %(limit)s::bigint;

-- name: sensor_summaries
-- Each sensor's latest observation (its outcome: green, red or error) and
-- latest claimed tick; how many errors it recorded in a row since its latest
-- green or red one (consecutive_errors, counted up to 10000), and its latest
-- error's reason and start. Sensor names are found by a skip scan (one index
-- probe per distinct sensor on observation_by_sensor and the sensor_tick
-- key), and the latest verdict and error by one probe each of their partial
-- indexes (observation_last_verdict, observation_errors), so the cost follows
-- the number of sensors and their current streak of errors, not of
-- observations; limit bounds both the scan and the answer.
WITH RECURSIVE observed(sensor, n) AS (
    (SELECT o.sensor, 1 FROM ledger_api.observations o ORDER BY o.sensor LIMIT 1)
    UNION ALL
    SELECT (SELECT o.sensor FROM ledger_api.observations o
             WHERE o.sensor > observed.sensor ORDER BY o.sensor LIMIT 1), observed.n + 1
      FROM observed
     WHERE observed.sensor IS NOT NULL AND observed.n < %(limit)s::integer
), ticked(sensor, n) AS (
    (SELECT t.sensor, 1 FROM ledger_api.sensor_ticks t ORDER BY t.sensor LIMIT 1)
    UNION ALL
    SELECT (SELECT t.sensor FROM ledger_api.sensor_ticks t
             WHERE t.sensor > ticked.sensor ORDER BY t.sensor LIMIT 1), ticked.n + 1
      FROM ticked
     WHERE ticked.sensor IS NOT NULL AND ticked.n < %(limit)s::integer
), names AS (
    SELECT sensor FROM observed WHERE sensor IS NOT NULL
    UNION
    SELECT sensor FROM ticked WHERE sensor IS NOT NULL
)
SELECT n.sensor, o.id AS observation_id, o.target, o.objective_key, o.status, o.effect,
       o.campaign_id, o.started_at, o.finished_at, o.recorded_at,
       t.tick AS last_tick, t.claimed_by AS tick_claimed_by, t.claimed_at AS tick_claimed_at,
       e.consecutive_errors, le.reason AS last_error, le.started_at AS last_error_at,
       le.id AS last_error_id
  FROM names n
  LEFT JOIN LATERAL (SELECT * FROM ledger_api.observations o
                      WHERE o.sensor = n.sensor ORDER BY o.id DESC LIMIT 1) o ON true
  LEFT JOIN LATERAL (SELECT * FROM ledger_api.sensor_ticks t
                      WHERE t.sensor = n.sensor ORDER BY t.tick DESC LIMIT 1) t ON true
  LEFT JOIN LATERAL (SELECT v.id FROM ledger_api.observations v
                      WHERE v.sensor = n.sensor AND v.status <> 'error'
                      ORDER BY v.id DESC LIMIT 1) verdict ON true
  LEFT JOIN LATERAL (SELECT count(*)::integer AS consecutive_errors
                       FROM (SELECT 1 FROM ledger_api.observations x
                              WHERE x.sensor = n.sensor AND x.id > coalesce(verdict.id, 0)
                              LIMIT 10000) streak) e ON true
  LEFT JOIN LATERAL (SELECT x.id, x.reason, x.started_at FROM ledger_api.observations x
                      WHERE x.sensor = n.sensor AND x.status = 'error'
                      ORDER BY x.id DESC LIMIT 1) le ON true
 ORDER BY n.sensor
 LIMIT %(limit)s::integer;

-- name: sensor_outcome_counts
-- Observations recorded per sensor and outcome (a counter: observations are
-- never deleted). A full pass over the observations, as transition_counts is
-- over the journal: fine at the scale Ledger is built for.
SELECT sensor, status AS outcome, count(*) AS count
  FROM ledger_api.observations
 GROUP BY 1, 2
 ORDER BY 1, 2;
