-- Attempts

-- One row per claim. Its ending (outcome) is written once.
CREATE TABLE IF NOT EXISTS ledger.attempt (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id       bigint NOT NULL REFERENCES ledger.campaign (id),
    attempt_no        integer NOT NULL CHECK (attempt_no > 0),
    generation        bigint NOT NULL,
    worker            text NOT NULL,
    claimed_at        timestamptz NOT NULL,
    lease_expires_at  timestamptz NOT NULL,
    last_heartbeat_at timestamptz,
    heartbeat_count   integer NOT NULL DEFAULT 0,
    outcome           text NOT NULL DEFAULT 'running'
                      CHECK (outcome IN ('running', 'attempted', 'failed', 'lost',
                                         'drained', 'abandoned')),
    verdict           text CHECK (verdict IN ('accepted', 'rejected')),
    ended_at          timestamptz,
    failure_reason    text,
    fingerprint       text,
    base_sha          text,
    candidate_sha     text,
    bundle            jsonb,
    bundle_digest     text,
    log_tail          text,
    CONSTRAINT attempt_number_unique UNIQUE (campaign_id, attempt_no),
    CONSTRAINT attempt_generation_unique UNIQUE (campaign_id, generation),
    CONSTRAINT attempt_ended CHECK ((outcome = 'running') = (ended_at IS NULL)),
    CONSTRAINT attempt_verdict_after_record CHECK (verdict IS NULL OR outcome = 'attempted')
);
CREATE UNIQUE INDEX IF NOT EXISTS attempt_one_running ON ledger.attempt (campaign_id) WHERE outcome = 'running';
CREATE INDEX IF NOT EXISTS attempt_fingerprint ON ledger.attempt (campaign_id, fingerprint)
    WHERE fingerprint IS NOT NULL;

-- An attempt ends once; a verdict is given once.
CREATE OR REPLACE FUNCTION ledger.attempt_guard() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF OLD.outcome <> 'running' AND NEW.outcome IS DISTINCT FROM OLD.outcome THEN
        RAISE EXCEPTION 'attempt % of campaign % already ended as %',
            OLD.attempt_no, OLD.campaign_id, OLD.outcome
            USING ERRCODE = 'LG002';
    END IF;
    IF OLD.verdict IS NOT NULL AND NEW.verdict IS DISTINCT FROM OLD.verdict THEN
        RAISE EXCEPTION 'attempt % of campaign % already has the verdict %',
            OLD.attempt_no, OLD.campaign_id, OLD.verdict
            USING ERRCODE = 'LG002';
    END IF;
    IF NEW.generation <> OLD.generation OR NEW.campaign_id <> OLD.campaign_id
       OR NEW.worker <> OLD.worker THEN
        RAISE EXCEPTION 'an attempt''s identity cannot change' USING ERRCODE = 'LG002';
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER attempt_guard BEFORE UPDATE ON ledger.attempt
    FOR EACH ROW EXECUTE FUNCTION ledger.attempt_guard();
