-- Sensor ticks
--
-- A sensor process claims a scheduled tick before it runs the check, so two
-- processes on the same schedule never both observe one tick (the second finds
-- the row and skips). The observation itself stays unique per (sensor, tick).

CREATE TABLE IF NOT EXISTS ledger.sensor_tick (
    sensor     text NOT NULL CHECK (length(sensor) BETWEEN 1 AND 200),
    tick       timestamptz NOT NULL,
    claimed_by text NOT NULL,
    claimed_at timestamptz NOT NULL,
    PRIMARY KEY (sensor, tick)
);

-- When each sensor was first seen (register_sensor): a new sensor's first
-- scheduled tick is the next one after it, never one from before (a new
-- nightly sensor does not fire for last night).
CREATE TABLE IF NOT EXISTS ledger.sensor (
    name          text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    registered_at timestamptz NOT NULL,
    registered_by text NOT NULL CHECK (length(registered_by) BETWEEN 1 AND 200)
);
