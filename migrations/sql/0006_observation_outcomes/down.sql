-- 0005 down: two outcomes again, no hysteresis, no re-observation; the files
-- as 0004 left them are put back after this. Error observations go: the
-- schema before 0005 cannot hold them (they never moved a campaign).
DROP FUNCTION IF EXISTS ledger_api.reobserve(bigint, bigint, text, text, timestamptz, timestamptz,
                                             jsonb, text);
DROP FUNCTION IF EXISTS ledger_api.record_observation(
    text, text, text, text, timestamptz, timestamptz, jsonb, text, timestamptz, text, text, jsonb,
    text[], jsonb, integer, integer);
DROP FUNCTION IF EXISTS ledger.lock_objective(text);
DROP FUNCTION IF EXISTS ledger.error_reason(jsonb);
DELETE FROM ledger.transition WHERE name = 'dismiss' AND from_state = 'leased';
DROP INDEX IF EXISTS ledger.observation_streak;
DROP INDEX IF EXISTS ledger.observation_last_verdict;
DROP INDEX IF EXISTS ledger.observation_errors;
DELETE FROM ledger.observation WHERE status = 'error';
ALTER TABLE ledger.observation DROP CONSTRAINT observation_status_check;
ALTER TABLE ledger.observation ADD CONSTRAINT observation_status_check CHECK (status IN ('green', 'red'));
