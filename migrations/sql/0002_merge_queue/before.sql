-- 0002, before the 0.2.0 schema files (schema/): what CREATE ... IF NOT
-- EXISTS cannot change on a table that exists. Run as the owner.

-- state_machine.sql: what each transition charges, and two new transitions
ALTER TABLE ledger.transition
    ADD COLUMN attempt_charge smallint NOT NULL DEFAULT 0
        CONSTRAINT transition_attempt_charge_check CHECK (attempt_charge BETWEEN -1 AND 1);
UPDATE ledger.transition SET attempt_charge = 1
 WHERE name IN ('record_attempt', 'fail_attempt', 'expire_lease');
UPDATE ledger.transition SET attempt_charge = -1,
       note = 'the target moved and the accepted candidate does not apply onto it: a new attempt is needed, and the spent one is given back'
 WHERE name = 'promote_failed';
UPDATE ledger.transition SET note = 'fenced; the attempt''s own failure: failure reason; charged; backoff'
 WHERE name = 'fail_attempt';
INSERT INTO ledger.transition (name, from_state, to_state, owner_role, attempt_charge, note) VALUES
    ('release', 'leased', 'ready', 'worker', 0, 'fenced; a fault that is not the attempt''s own (the system, its configuration, a worker shutting down): nothing charged; retried after a pause'),
    ('requeue', 'attempted', 'verified', 'verifier', 0, 'the merge queue''s stack of several candidates failed with this one on top: no verdict on it alone; back in the queue with its own candidate, nothing charged');

-- campaign.sql: the class's quorum, heartbeat and pause
ALTER TABLE ledger.campaign_class
    ADD COLUMN verifiers text[],
    ADD COLUMN heartbeat_seconds double precision,
    ADD COLUMN paused_at timestamptz,
    ADD CONSTRAINT campaign_class_check
        CHECK (heartbeat_seconds > 0 AND heartbeat_seconds < lease_seconds);
-- a 0.1.0 class had one verifier: its quorum is that one
UPDATE ledger.campaign_class SET verifiers = ARRAY[verifier];
ALTER TABLE ledger.campaign_class
    ALTER COLUMN verifiers SET DEFAULT '{command}',
    ALTER COLUMN verifiers SET NOT NULL,
    ADD CONSTRAINT campaign_class_verifiers_quorum
        CHECK (cardinality(verifiers) BETWEEN 1 AND 8 AND verifiers[1] = verifier
               AND array_position(verifiers, NULL) IS NULL);

-- campaign.sql: the row's rules move from CHECKs into the guard trigger; why
-- a campaign waits; the trace context of its open
ALTER TABLE ledger.campaign
    DROP CONSTRAINT campaign_attempt_count_check,
    DROP CONSTRAINT campaign_generation_check,
    DROP CONSTRAINT campaign_lease_iff_leased,
    DROP CONSTRAINT campaign_max_attempts_check,
    DROP CONSTRAINT campaign_objective_key_check,
    DROP CONSTRAINT campaign_seat_check,
    DROP CONSTRAINT campaign_target_check,
    ADD COLUMN waiting_on text,
    ADD COLUMN waiting_reason text,
    ADD COLUMN waiting_since timestamptz,
    ADD COLUMN fault_count integer NOT NULL DEFAULT 0,
    ADD COLUMN trace_context jsonb;

-- attempt.sql: the same for attempts; the candidate's diff and published ref
ALTER TABLE ledger.attempt
    DROP CONSTRAINT attempt_attempt_no_check,
    DROP CONSTRAINT attempt_ended,
    DROP CONSTRAINT attempt_outcome_check,
    DROP CONSTRAINT attempt_verdict_after_record,
    DROP CONSTRAINT attempt_verdict_check,
    ADD COLUMN diff bytea,
    ADD COLUMN candidate_ref text;

-- journal.sql: the event type's rule without a counted repetition (the same
-- set of types)
ALTER TABLE ledger.campaign_event
    DROP CONSTRAINT campaign_event_type_check,
    ADD CONSTRAINT campaign_event_type_check
        CHECK (length(type) <= 64 AND type ~ '^[a-z][a-z0-9_.]*$') NOT VALID;
ALTER TABLE ledger.campaign_event VALIDATE CONSTRAINT campaign_event_type_check;

-- observation.sql: bounded input, and why an observation had no effect
ALTER TABLE ledger.observation
    ADD COLUMN reason text CONSTRAINT observation_reason_check CHECK (length(reason) <= 4000),
    ADD CONSTRAINT observation_target_check CHECK (length(target) BETWEEN 1 AND 2000) NOT VALID,
    ADD CONSTRAINT observation_objective_key_check
        CHECK (length(objective_key) BETWEEN 1 AND 500) NOT VALID,
    ADD CONSTRAINT observation_instants_sane CHECK (
        started_at >= '2000-01-01 00:00:00+00' AND finished_at < '2200-01-01 00:00:00+00'
        AND (tick IS NULL OR (tick >= '2000-01-01 00:00:00+00' AND tick < '2200-01-01 00:00:00+00')))
        NOT VALID;
ALTER TABLE ledger.observation VALIDATE CONSTRAINT observation_target_check;
ALTER TABLE ledger.observation VALIDATE CONSTRAINT observation_objective_key_check;
ALTER TABLE ledger.observation VALIDATE CONSTRAINT observation_instants_sane;

-- verification.sql: which kind of the class's quorum a verification is; a
-- released one
ALTER TABLE ledger.verification ADD COLUMN kind text;
UPDATE ledger.verification v SET kind = cc.verifier
  FROM ledger.campaign c JOIN ledger.campaign_class cc ON cc.name = c.class
 WHERE c.id = v.campaign_id;
ALTER TABLE ledger.verification
    ALTER COLUMN kind SET NOT NULL,
    DROP CONSTRAINT verification_status_check,
    ADD CONSTRAINT verification_status_check
        CHECK (status IN ('running', 'accepted', 'rejected', 'lost', 'released', 'abandoned'));

-- Functions whose argument lists changed: a new argument list is a new
-- function to PostgreSQL, so the old ones go (the files define the new).
DROP FUNCTION ledger.open_campaign(text, text, text, jsonb, jsonb, integer, text, text[], jsonb, text, boolean);
DROP FUNCTION ledger_api.claim_verification(text, text, double precision, text[]);
DROP FUNCTION ledger_api.open_campaign(text, text, text, jsonb, jsonb, integer, text, text[], jsonb, text);
DROP FUNCTION ledger_api.rebase_promotion(bigint, bigint, text, text, jsonb, text, text);
DROP FUNCTION ledger_api.record_attempt(bigint, bigint, text, text, text, jsonb, text, text, text);
DROP FUNCTION ledger_api.record_observation(text, text, text, text, timestamptz, timestamptz, jsonb, text,
                                            timestamptz, text, text, jsonb, text[]);
DROP FUNCTION ledger_api.register_class(text, integer, double precision, double precision, double precision,
                                        double precision, double precision, text, jsonb, jsonb, jsonb, text,
                                        integer);
