-- Observations

-- Sensors' observations of targets. (sensor, tick) is unique: two sensor
-- processes on one schedule record one observation per tick.
CREATE TABLE IF NOT EXISTS ledger.observation (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    sensor          text NOT NULL CHECK (length(sensor) BETWEEN 1 AND 200),
    target          text NOT NULL,
    objective_key   text NOT NULL,
    class           text REFERENCES ledger.campaign_class (name),
    status          text NOT NULL CHECK (status IN ('green', 'red')),
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz NOT NULL,
    tick            timestamptz,
    details         jsonb NOT NULL DEFAULT '{}',
    campaign_id     bigint REFERENCES ledger.campaign (id),
    effect          text NOT NULL CHECK (effect IN ('opened', 'regressed', 'confirmed',
                                                    'dismissed', 'recorded')),
    idempotency_key text UNIQUE,
    request_digest  text,
    recorded_at     timestamptz NOT NULL,
    CONSTRAINT observation_one_per_tick UNIQUE (sensor, tick),
    CONSTRAINT observation_ordered CHECK (finished_at >= started_at)
);
CREATE INDEX IF NOT EXISTS observation_by_campaign ON ledger.observation (campaign_id, id);
CREATE INDEX IF NOT EXISTS observation_by_sensor ON ledger.observation (sensor, id DESC);
