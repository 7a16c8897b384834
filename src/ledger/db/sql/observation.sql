-- Observations

-- Sensors' observations of targets. (sensor, tick) is unique: two sensor
-- processes on one schedule record one observation per tick.
--
-- Three outcomes (status): green and red say what the target is; error says
-- that the check itself failed (an exit code it does not declare red, a
-- timeout, a check killed by its cell, a cell that could not be built, a
-- pytest run the judge cannot trust). An error is kept with its evidence and
-- its reason, and moves no campaign.
CREATE TABLE IF NOT EXISTS ledger.observation (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sensor          text NOT NULL CHECK (length(sensor) BETWEEN 1 AND 200),
    target          text NOT NULL CHECK (length(target) BETWEEN 1 AND 2000),
    objective_key   text NOT NULL CHECK (length(objective_key) BETWEEN 1 AND 500),
    class           text REFERENCES ledger.campaign_class (name),
    status          text NOT NULL CHECK (status IN ('green', 'red', 'error')),
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz NOT NULL,
    tick            timestamptz,
    details         jsonb NOT NULL DEFAULT '{}' CONSTRAINT observation_details_bounded
                    CHECK (jsonb_typeof(details) = 'object' AND ledger.json_within(details, 32, 262144)),
    campaign_id     bigint REFERENCES ledger.campaign (id),
    effect          text NOT NULL CHECK (effect IN ('opened', 'regressed', 'confirmed',
                                                    'dismissed', 'recorded')),
    idempotency_key text UNIQUE,
    request_digest  text,
    recorded_at     timestamptz NOT NULL,
    -- why it had no effect it could have had: a green one that could not
    -- confirm (the opening baseline's tests not seen passing), one of a
    -- streak still too short (open_after, confirm_after), an error (what
    -- went wrong with the check)
    reason          text CHECK (length(reason) <= 4000),
    CONSTRAINT observation_one_per_tick UNIQUE (sensor, tick),
    CONSTRAINT observation_ordered CHECK (finished_at >= started_at),
    -- Instants a sensor gives lie in a sane window (ledger.bounds): a BC
    -- instant, or one past year 9999, is one no reader could render.
    CONSTRAINT observation_instants_sane CHECK (
        started_at >= '2000-01-01 00:00:00+00' AND finished_at < '2200-01-01 00:00:00+00'
        AND (tick IS NULL OR (tick >= '2000-01-01 00:00:00+00' AND tick < '2200-01-01 00:00:00+00')))
);
CREATE INDEX IF NOT EXISTS observation_by_campaign ON ledger.observation (campaign_id, id);
CREATE INDEX IF NOT EXISTS observation_by_sensor ON ledger.observation (sensor, id DESC);
-- The streak a red or green observation counts in (record_observation:
-- open_after, confirm_after): the latest green and red ones of an objective,
-- errors left out, so the streak is read in as many index entries as it is
-- long.
CREATE INDEX IF NOT EXISTS observation_streak ON ledger.observation (objective_key, id DESC)
    WHERE status <> 'error';
-- A sensor's latest green or red observation: its errors since then are its
-- consecutive errors (sensor_summaries), however long it has been failing.
CREATE INDEX IF NOT EXISTS observation_last_verdict ON ledger.observation (sensor, id DESC)
    WHERE status <> 'error';
-- A sensor's latest error, whenever it was (the reason a status shows).
CREATE INDEX IF NOT EXISTS observation_errors ON ledger.observation (sensor, id DESC)
    WHERE status = 'error';
