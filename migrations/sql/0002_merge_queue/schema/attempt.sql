-- Attempts

-- One row per claim. Its ending (outcome) is written once.
CREATE TABLE IF NOT EXISTS ledger.attempt (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    campaign_id       bigint NOT NULL REFERENCES ledger.campaign (id),
    -- (its rules are kept by attempt_guard, below, not by CHECKs: see there)
    attempt_no        integer NOT NULL,  -- 1 or more
    generation        bigint NOT NULL,
    worker            text NOT NULL,
    claimed_at        timestamptz NOT NULL,
    lease_expires_at  timestamptz NOT NULL,
    last_heartbeat_at timestamptz,
    heartbeat_count   integer NOT NULL DEFAULT 0,
    -- running, attempted, failed, lost, drained, released or abandoned; ended_at
    -- set iff it is no longer running (attempt_ended)
    outcome           text NOT NULL DEFAULT 'running',
    -- NULL, accepted or rejected; only for an attempted one (attempt_verdict_after_record)
    verdict           text,
    ended_at          timestamptz,
    failure_reason    text,
    fingerprint       text,
    base_sha          text,
    candidate_sha     text,
    bundle            jsonb,
    bundle_digest     text,
    -- The candidate's diff from its base: with the bundle, the evidence every
    -- later role reads from here, never from the worker's disk (bounded: a
    -- larger candidate is refused before it is recorded).
    diff              bytea,  -- at most 64 MiB (attempt_diff_check)
    -- Where the candidate was published (refs/heads/ledger/<campaign>/<attempt>
    -- on the class's repository, a remote for a URL): the verifier and the
    -- dispatcher fetch it from there.
    candidate_ref     text,  -- refs/<name> (attempt_candidate_ref_check)
    log_tail          text,
    CONSTRAINT attempt_number_unique UNIQUE (campaign_id, attempt_no),
    CONSTRAINT attempt_generation_unique UNIQUE (campaign_id, generation)
);
CREATE UNIQUE INDEX IF NOT EXISTS attempt_one_running ON ledger.attempt (campaign_id) WHERE outcome = 'running';
CREATE INDEX IF NOT EXISTS attempt_fingerprint ON ledger.attempt (campaign_id, fingerprint)
    WHERE fingerprint IS NOT NULL;

-- An attempt ends once; a verdict is given once. And the row's own rules,
-- which were CHECK constraints (see campaign_guard for why a trigger keeps
-- them): the same SQLSTATE (23514) and constraint names.
CREATE OR REPLACE FUNCTION ledger.attempt_guard() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
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
    END IF;
    -- The row's own rules (NULL passes, as it passes a CHECK: verdict may be NULL).
    IF NEW.attempt_no < 1
       OR NEW.outcome NOT IN ('running', 'attempted', 'failed', 'lost', 'drained', 'released', 'abandoned')
       OR NEW.verdict NOT IN ('accepted', 'rejected')
       OR (NEW.outcome = 'running') <> (NEW.ended_at IS NULL)
       OR (NEW.verdict IS NOT NULL AND NEW.outcome <> 'attempted')
       OR octet_length(NEW.diff) > 67108864
       OR NOT (length(NEW.candidate_ref) BETWEEN 6 AND 245
               AND NEW.candidate_ref ~ '^refs/[A-Za-z0-9/_.-]+$') THEN
        -- the first broken one by name, as PostgreSQL tests CHECKs
        PERFORM ledger.refuse_row('attempt', CASE
            WHEN NEW.attempt_no < 1 THEN 'attempt_attempt_no_check'
            WHEN (NEW.outcome = 'running') <> (NEW.ended_at IS NULL) THEN 'attempt_ended'
            WHEN NEW.outcome NOT IN ('running', 'attempted', 'failed', 'lost', 'drained', 'released',
                                     'abandoned')
                THEN 'attempt_outcome_check'
            WHEN NEW.verdict IS NOT NULL AND NEW.outcome <> 'attempted' THEN 'attempt_verdict_after_record'
            WHEN octet_length(NEW.diff) > 67108864 THEN 'attempt_diff_check'
            WHEN NOT (length(NEW.candidate_ref) BETWEEN 6 AND 245
                      AND NEW.candidate_ref ~ '^refs/[A-Za-z0-9/_.-]+$') THEN 'attempt_candidate_ref_check'
            ELSE 'attempt_verdict_check' END);
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER attempt_guard BEFORE INSERT OR UPDATE ON ledger.attempt
    FOR EACH ROW EXECUTE FUNCTION ledger.attempt_guard();
