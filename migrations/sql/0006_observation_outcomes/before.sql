-- 0005, before its schema files (schema/): what CREATE ... IF NOT EXISTS and
-- CREATE OR REPLACE cannot change. Run as the owner.

-- api_sensor.sql: record_observation takes open_after and confirm_after (with
-- defaults: a 0.2.0 sensor's named call still reaches it); a changed argument
-- list is a new function, so the old one goes first.
DROP FUNCTION IF EXISTS ledger_api.record_observation(
    text, text, text, text, timestamptz, timestamptz, jsonb, text, timestamptz, text, text, jsonb,
    text[], jsonb);

-- observation.sql: a third outcome, error (the check's own failure). Widening
-- the CHECK: added NOT VALID, then validated without blocking writes.
ALTER TABLE ledger.observation DROP CONSTRAINT observation_status_check;
ALTER TABLE ledger.observation ADD CONSTRAINT observation_status_check
    CHECK (status IN ('green', 'red', 'error')) NOT VALID;
ALTER TABLE ledger.observation VALIDATE CONSTRAINT observation_status_check;

-- state_machine.sql: the worker dismisses the campaign it holds when its
-- re-observation of the target is green (ledger_api.reobserve).
INSERT INTO ledger.transition (name, from_state, to_state, owner_role, attempt_charge, note) VALUES
    ('dismiss', 'leased', 'dismissed', 'worker', 0, 'fenced; the worker re-observed the target green (the class''s sensor, once, in a cell) before its agent ran or before charging an attempt that changed nothing: nothing charged');
