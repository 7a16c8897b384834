-- Verifications

-- A verifier's check of one recorded attempt, with its own short lease.
CREATE TABLE IF NOT EXISTS ledger.verification (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id      bigint NOT NULL REFERENCES ledger.campaign (id),
    attempt_id       bigint NOT NULL REFERENCES ledger.attempt (id),
    generation       bigint NOT NULL,
    verifier         text NOT NULL,
    model_family     text,
    status           text NOT NULL DEFAULT 'running'
                     CHECK (status IN ('running', 'accepted', 'rejected', 'lost', 'abandoned')),
    claimed_at       timestamptz NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    finished_at      timestamptz,
    reason           text,
    evidence         jsonb NOT NULL DEFAULT '{}',
    CONSTRAINT verification_finished CHECK ((status = 'running') = (finished_at IS NULL))
);
CREATE UNIQUE INDEX IF NOT EXISTS verification_one_running ON ledger.verification (campaign_id)
    WHERE status = 'running';
CREATE INDEX IF NOT EXISTS verification_by_campaign ON ledger.verification (campaign_id, id);
