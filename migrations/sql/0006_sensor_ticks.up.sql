-- 0006 sensor ticks
--
-- A sensor process claims a scheduled tick before it runs the check, so two
-- processes on the same schedule never both observe one tick (the second finds
-- the row and skips). The observation itself stays unique per (sensor, tick).

CREATE TABLE ledger.sensor_tick (
    sensor     text NOT NULL CHECK (length(sensor) BETWEEN 1 AND 200),
    tick       timestamptz NOT NULL,
    claimed_by text NOT NULL,
    claimed_at timestamptz NOT NULL,
    PRIMARY KEY (sensor, tick)
);

-- True if this caller now owns the tick; false if another process had it.
CREATE FUNCTION ledger_api.claim_sensor_tick(p_sensor text, p_tick timestamptz, p_identity text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_rows integer;
BEGIN
    IF p_tick IS NULL OR p_tick > ledger.now() + interval '1 minute' THEN
        RAISE EXCEPTION 'a tick must be given and not in the future' USING ERRCODE = 'LG007';
    END IF;
    INSERT INTO ledger.sensor_tick (sensor, tick, claimed_by, claimed_at)
    VALUES (p_sensor, p_tick, p_identity, ledger.now())
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows = 1;
END
$$;

CREATE VIEW ledger_api.sensor_ticks AS
SELECT sensor, tick, claimed_by, claimed_at FROM ledger.sensor_tick;

DO $$
BEGIN
    EXECUTE format('REVOKE ALL ON FUNCTION ledger_api.claim_sensor_tick(text, timestamptz, text) FROM PUBLIC');
    EXECUTE format('GRANT EXECUTE ON FUNCTION ledger_api.claim_sensor_tick(text, timestamptz, text) TO %I',
                   ledger.role_name('sensor'));
    EXECUTE format('GRANT SELECT ON ledger_api.sensor_ticks TO %I', ledger.role_name('reader'));
END
$$;
