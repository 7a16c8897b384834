-- Reads of ledger_api.security_events (see campaigns.sql for the conventions).

-- name: security_events
-- Refused writes, of one campaign or (campaign_id NULL) of all.
SELECT * FROM ledger_api.security_events
 WHERE %(campaign_id)s::bigint IS NULL OR campaign_id = %(campaign_id)s::bigint
 ORDER BY id;
