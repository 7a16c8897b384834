-- Verifications

-- A verifier's check of one recorded attempt, with its own short lease.
CREATE TABLE IF NOT EXISTS ledger.verification (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id      bigint NOT NULL REFERENCES ledger.campaign (id),
    attempt_id       bigint NOT NULL REFERENCES ledger.attempt (id),
    generation       bigint NOT NULL,
    verifier         text NOT NULL,
    -- which of the class's quorum (campaign_class.verifiers) this verdict is
    kind             text NOT NULL,
    model_family     text,
    status           text NOT NULL DEFAULT 'running'
                     CHECK (status IN ('running', 'accepted', 'rejected', 'lost', 'released', 'abandoned')),
    claimed_at       timestamptz NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    -- the length its holder asks for at each claim and heartbeat (restart_grace
    -- gives it again after a restart of the database)
    lease_s          double precision,
    finished_at      timestamptz,
    reason           text,
    evidence         jsonb NOT NULL DEFAULT '{}',
    CONSTRAINT verification_finished CHECK ((status = 'running') = (finished_at IS NULL))
);
CREATE UNIQUE INDEX IF NOT EXISTS verification_one_running ON ledger.verification (campaign_id)
    WHERE status = 'running';
CREATE INDEX IF NOT EXISTS verification_by_campaign ON ledger.verification (campaign_id, id);
-- One verdict per required verifier per attempt: a lost or released
-- verification may be retried, a verdict (or a running check) never doubled.
CREATE UNIQUE INDEX IF NOT EXISTS verification_one_per_kind ON ledger.verification (attempt_id, kind)
    WHERE status IN ('running', 'accepted', 'rejected');
