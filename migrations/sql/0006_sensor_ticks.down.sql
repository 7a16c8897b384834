-- 0006 down
DROP VIEW IF EXISTS ledger_api.sensor_ticks;
DROP FUNCTION IF EXISTS ledger_api.claim_sensor_tick(text, timestamptz, text);
DROP TABLE IF EXISTS ledger.sensor_tick;
