-- 0002 up: the campaign keeps the W3C trace context of its open (campaign.sql).
-- The baseline applies the live schema files, so a database built by it has
-- the column already; one built before this revision gets it here.
ALTER TABLE ledger.campaign ADD COLUMN IF NOT EXISTS trace_context jsonb;

-- The open gained p_trace_context: a changed argument list is a new function
-- to PostgreSQL, so the old ones go (api_sensor.sql defines the new ones).
DROP FUNCTION IF EXISTS ledger.open_campaign(text, text, text, jsonb, jsonb, integer, text, text[],
                                              jsonb, text, boolean);
DROP FUNCTION IF EXISTS ledger_api.open_campaign(text, text, text, jsonb, jsonb, integer, text,
                                                  text[], jsonb, text);
DROP FUNCTION IF EXISTS ledger_api.record_observation(text, text, text, text, timestamptz,
                                                       timestamptz, jsonb, text, timestamptz, text,
                                                       text, jsonb, text[]);
