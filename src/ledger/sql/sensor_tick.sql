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
