-- Security events

-- Refused writes, and what a worker's cell saw an attempt try (a process left
-- behind, its monitor killed, Ledger's secret in its output, the user's
-- repository or Ledger's configuration changed while it ran). Written by
-- functions that then return a refusal instead of raising, so the record
-- survives.
CREATE TABLE IF NOT EXISTS ledger.security_event (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL,
    actor_role  text NOT NULL,
    actor       text NOT NULL,
    campaign_id bigint REFERENCES ledger.campaign (id),
    action      text NOT NULL,
    target      text NOT NULL,
    reason      text NOT NULL,
    details     jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS security_event_by_campaign ON ledger.security_event (campaign_id, id);
