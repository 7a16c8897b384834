-- The outbox (mechanism 9)
--
-- A side effect is an intent row, committed before its action happens; a
-- dispatcher claims it, acts with its precondition and reads the target back
-- (api_dispatcher.sql).

CREATE TABLE IF NOT EXISTS ledger.side_effect (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id      bigint NOT NULL REFERENCES ledger.campaign (id),
    generation       bigint NOT NULL,
    kind             text NOT NULL CHECK (kind IN ('git.update_ref', 'http.request')),
    purpose          text NOT NULL DEFAULT 'other' CHECK (purpose IN ('promotion', 'other')),
    target           text NOT NULL,
    precondition     jsonb NOT NULL DEFAULT '{}',
    payload          jsonb NOT NULL DEFAULT '{}',
    idempotency_key  text NOT NULL UNIQUE,
    requested_by     text NOT NULL,
    requested_role   text NOT NULL REFERENCES ledger.actor (name),
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'claimed', 'done', 'conflict', 'failed',
                                      'cancelled')),
    claimed_by       text,
    claim_token      bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    tries            integer NOT NULL DEFAULT 0,
    next_try_at      timestamptz NOT NULL,
    result           jsonb,
    error            text,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    CONSTRAINT side_effect_claim CHECK ((state = 'claimed') = (claimed_by IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS side_effect_open ON ledger.side_effect (next_try_at, id)
    WHERE state IN ('pending', 'claimed');
CREATE INDEX IF NOT EXISTS side_effect_by_campaign ON ledger.side_effect (campaign_id, id);
