-- Security events

-- Refused writes. Written by functions that then return a refusal instead of
-- raising, so the record survives.
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
