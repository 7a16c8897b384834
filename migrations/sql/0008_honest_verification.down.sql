-- 0008 down: the functions back to their 0004 text, the new ones gone.
DROP FUNCTION IF EXISTS ledger_api.refuse_candidate(bigint, bigint, text, text, text[]);
DROP FUNCTION IF EXISTS ledger_api.register_sensor(text, text);
DROP VIEW IF EXISTS ledger_api.sensors;
DROP TABLE IF EXISTS ledger.sensor;
DELETE FROM ledger.transition WHERE name = 'dismiss' AND from_state = 'exhausted';

-- One call per observation, atomically: record it, then open, regress, confirm
-- or dismiss as the observation warrants.
CREATE OR REPLACE FUNCTION ledger_api.record_observation(
        p_sensor text, p_objective_key text, p_target text, p_status text,
        p_started_at timestamptz, p_finished_at timestamptz DEFAULT NULL,
        p_details jsonb DEFAULT '{}', p_class text DEFAULT NULL, p_tick timestamptz DEFAULT NULL,
        p_idempotency_key text DEFAULT NULL, p_request_digest text DEFAULT NULL,
        p_desired_state jsonb DEFAULT '{}', p_labels text[] DEFAULT '{}')
    RETURNS TABLE (observation_id bigint, campaign_id bigint, effect text, duplicate boolean)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_obs ledger.observation;
    v_c ledger.campaign;
    v_effect text := 'recorded';
    v_campaign bigint;
    v_transition text;
    v_to text;
BEGIN
    IF p_status IS NULL OR p_status NOT IN ('green', 'red') THEN
        RAISE EXCEPTION 'observation status must be green or red, not %', coalesce(p_status, 'null')
            USING ERRCODE = 'LG007';
    END IF;
    IF p_started_at IS NULL OR p_started_at > v_now THEN
        RAISE EXCEPTION 'observation start % must be given and not in the future', p_started_at
            USING ERRCODE = 'LG007';
    END IF;

    INSERT INTO ledger.observation AS o
           (sensor, target, objective_key, class, status, started_at, finished_at, tick, details,
            effect, idempotency_key, request_digest, recorded_at)
    VALUES (p_sensor, p_target, p_objective_key, p_class, p_status, p_started_at,
            coalesce(p_finished_at, v_now), p_tick, coalesce(p_details, '{}'), 'recorded',
            p_idempotency_key, p_request_digest, v_now)
    ON CONFLICT DO NOTHING
    RETURNING * INTO v_obs;
    IF v_obs.id IS NULL THEN
        -- Asked before: the same tick of this sensor, or the same idempotency key.
        SELECT * INTO v_obs FROM ledger.observation o
         WHERE (p_idempotency_key IS NOT NULL AND o.idempotency_key = p_idempotency_key)
            OR (p_tick IS NOT NULL AND o.sensor = p_sensor AND o.tick = p_tick)
         ORDER BY o.id LIMIT 1;
        IF p_idempotency_key IS NOT NULL AND v_obs.idempotency_key = p_idempotency_key
           AND v_obs.request_digest IS DISTINCT FROM p_request_digest THEN
            RAISE EXCEPTION 'idempotency key % was used for a different observation', p_idempotency_key
                USING ERRCODE = 'LG010';
        END IF;
        RETURN QUERY SELECT v_obs.id, v_obs.campaign_id, v_obs.effect, true;
        RETURN;
    END IF;

    SELECT * INTO v_c FROM ledger.campaign c
     WHERE c.objective_key = p_objective_key
       AND c.state NOT IN ('confirmed', 'dismissed', 'abandoned')
       FOR UPDATE;

    IF p_status = 'red' THEN
        IF v_c.id IS NULL THEN
            IF p_class IS NULL THEN
                RAISE EXCEPTION 'a red observation of % opens a campaign, so it needs a class',
                    p_objective_key USING ERRCODE = 'LG007';
            END IF;
            SELECT o.campaign_id, CASE WHEN o.created THEN 'opened' ELSE 'recorded' END
              INTO v_campaign, v_effect
              FROM ledger.open_campaign(p_class, p_objective_key, p_target, p_desired_state,
                                        jsonb_build_object('observation_id', v_obs.id,
                                                           'status', p_status,
                                                           'started_at', p_started_at,
                                                           'details', coalesce(p_details, '{}')),
                                        0, NULL, p_labels, NULL, p_sensor) o;
        ELSIF v_c.state = 'verified' AND v_c.promoted_at IS NOT NULL
              AND p_started_at > v_c.promoted_at THEN
            v_transition := 'regress'; v_to := 'ready'; v_effect := 'regressed';
        END IF;
    ELSE
        IF v_c.state = 'verified' AND v_c.promoted_at IS NOT NULL
           AND p_started_at > v_c.promoted_at THEN
            -- only an observation that started after the promotion can confirm it
            v_transition := 'confirm'; v_to := 'confirmed'; v_effect := 'confirmed';
        ELSIF v_c.state = 'ready' AND NOT EXISTS (
                  SELECT 1 FROM ledger.side_effect s
                   WHERE s.campaign_id = v_c.id AND s.state IN ('pending', 'claimed')) THEN
            v_transition := 'dismiss'; v_to := 'dismissed'; v_effect := 'dismissed';
        END IF;
    END IF;

    IF v_transition IS NOT NULL THEN
        PERFORM ledger.begin_transition(v_transition, 'sensor', p_sensor,
                    jsonb_build_object('observation_id', v_obs.id, 'status', p_status,
                                       'started_at', p_started_at));
        UPDATE ledger.campaign c
           SET state = v_to,
               promoted_at = CASE WHEN v_to = 'ready' THEN NULL ELSE c.promoted_at END,
               promoted_sha = CASE WHEN v_to = 'ready' THEN NULL ELSE c.promoted_sha END,
               next_attempt_at = CASE WHEN v_to = 'ready' THEN v_now ELSE c.next_attempt_at END,
               last_failure_reason = CASE WHEN v_to = 'ready'
                                          THEN 'regressed: red observation after promotion'
                                          ELSE c.last_failure_reason END
         WHERE c.id = v_c.id;
        PERFORM ledger.end_transition();
    END IF;
    v_campaign := coalesce(v_campaign, v_c.id);
    UPDATE ledger.observation o SET effect = v_effect, campaign_id = v_campaign WHERE o.id = v_obs.id;
    RETURN QUERY SELECT v_obs.id, v_campaign, v_effect, false;
END
$$;

-- The candidate passed: attempted -> verified. If the class promotes, the
-- promotion intent is committed with the verdict (intent before action).
CREATE OR REPLACE FUNCTION ledger_api.accept(p_verification_id bigint, p_evidence jsonb DEFAULT '{}')
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_v ledger.verification;
    v_a ledger.attempt;
    v_c ledger.campaign;
    v_promotion jsonb;
    v_effect bigint;
BEGIN
    v_v := ledger.current_verification(p_verification_id);
    SELECT * INTO v_a FROM ledger.attempt a WHERE a.id = v_v.attempt_id;
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = v_v.campaign_id;
    SELECT cc.promotion INTO v_promotion FROM ledger.campaign_class cc WHERE cc.name = v_c.class;

    UPDATE ledger.verification v
       SET status = 'accepted', finished_at = v_now, evidence = coalesce(p_evidence, '{}')
     WHERE v.id = v_v.id;
    UPDATE ledger.attempt a SET verdict = 'accepted' WHERE a.id = v_a.id;
    PERFORM ledger.begin_transition('accept', 'verifier', v_v.verifier,
                jsonb_build_object('verification_id', v_v.id, 'attempt_no', v_a.attempt_no,
                                   'candidate_sha', v_a.candidate_sha,
                                   'model_family', v_v.model_family));
    UPDATE ledger.campaign c
       SET state = 'verified',
           -- nothing to promote: the verdict itself is the point after which
           -- an observation may confirm
           promoted_at = CASE WHEN v_promotion ? 'ref' THEN NULL ELSE v_now END,
           promoted_sha = CASE WHEN v_promotion ? 'ref' THEN NULL ELSE v_a.candidate_sha END
     WHERE c.id = v_c.id;
    PERFORM ledger.end_transition();

    IF v_promotion ? 'ref' THEN
        INSERT INTO ledger.side_effect (campaign_id, generation, kind, purpose, target, precondition,
                                        payload, idempotency_key, requested_by, requested_role,
                                        next_try_at, created_at, updated_at)
        VALUES (v_c.id, v_c.generation, 'git.update_ref', 'promotion', v_promotion ->> 'ref',
                jsonb_build_object('old', v_a.base_sha),
                jsonb_build_object('new', v_a.candidate_sha,
                                   'repository', v_promotion ->> 'repository'),
                format('promote:%s:%s:%s', v_c.id, v_c.generation, v_a.attempt_no),
                v_v.verifier, 'verifier', v_now, v_now, v_now)
        RETURNING id INTO v_effect;
        PERFORM ledger.append_event(v_c.id, 'side_effect.requested', v_v.verifier,
                    jsonb_build_object('side_effect_id', v_effect, 'kind', 'git.update_ref',
                                       'purpose', 'promotion', 'target', v_promotion ->> 'ref'));
        PERFORM pg_notify('ledger_outbox', v_effect::text);
    END IF;
    RETURN v_effect;
END
$$;

-- Record what the dispatcher saw when it read the target back:
--   done     the target shows the effect (read back in p_result)
--   conflict the precondition failed; never retried blindly
--   retry    a transient failure; try again after p_retry_after_s
--   failed   a permanent failure
CREATE OR REPLACE FUNCTION ledger_api.complete_side_effect(
        p_side_effect_id bigint, p_claim_token bigint, p_outcome text,
        p_result jsonb DEFAULT '{}', p_error text DEFAULT NULL,
        p_retry_after_s double precision DEFAULT 5)
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_s ledger.side_effect;
    v_c ledger.campaign;
    v_state text;
BEGIN
    IF p_outcome IS NULL OR p_outcome NOT IN ('done', 'conflict', 'retry', 'failed') THEN
        RAISE EXCEPTION 'outcome must be done, conflict, retry or failed' USING ERRCODE = 'LG007';
    END IF;
    SELECT * INTO v_s FROM ledger.side_effect s WHERE s.id = p_side_effect_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'side effect % does not exist', p_side_effect_id USING ERRCODE = 'LG004';
    END IF;
    -- lock order: campaign, then side effect (as abandon does)
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = v_s.campaign_id FOR UPDATE;
    SELECT * INTO v_s FROM ledger.side_effect s WHERE s.id = p_side_effect_id FOR UPDATE;
    IF v_s.state <> 'claimed' OR v_s.claim_token <> p_claim_token THEN
        RAISE EXCEPTION 'side effect % is no longer claimed by this dispatcher (state %)',
            p_side_effect_id, v_s.state USING ERRCODE = 'LG001';
    END IF;
    v_state := CASE p_outcome WHEN 'retry' THEN 'pending' ELSE p_outcome END;
    UPDATE ledger.side_effect s
       SET state = v_state,
           claimed_by = NULL, lease_expires_at = NULL,
           result = coalesce(p_result, '{}'), error = left(p_error, 4000),
           next_try_at = CASE WHEN p_outcome = 'retry'
                              THEN v_now + make_interval(secs => greatest(p_retry_after_s, 0))
                              ELSE s.next_try_at END,
           finished_at = CASE WHEN p_outcome = 'retry' THEN NULL ELSE v_now END,
           updated_at = v_now
     WHERE s.id = v_s.id;

    IF (SELECT st.is_terminal FROM ledger.state st WHERE st.name = v_c.state) THEN
        RETURN v_state;  -- the campaign closed meanwhile; its journal is sealed
    END IF;
    PERFORM ledger.append_event(v_c.id, 'side_effect.' || v_state, v_s.claimed_by,
                jsonb_build_object('side_effect_id', v_s.id, 'kind', v_s.kind,
                                   'target', v_s.target, 'result', coalesce(p_result, '{}'),
                                   'error', p_error));
    IF v_s.purpose = 'promotion' AND v_c.state = 'verified' AND v_c.generation = v_s.generation THEN
        IF p_outcome = 'done' THEN
            UPDATE ledger.campaign c
               SET promoted_at = v_now, promoted_sha = v_s.payload ->> 'new'
             WHERE c.id = v_c.id;
        ELSIF p_outcome IN ('conflict', 'failed') THEN
            PERFORM ledger.begin_transition('promote_failed', 'dispatcher', v_s.claimed_by,
                        jsonb_build_object('side_effect_id', v_s.id, 'outcome', p_outcome,
                                           'result', coalesce(p_result, '{}'), 'error', p_error));
            UPDATE ledger.campaign c
               SET state = 'ready', next_attempt_at = v_now, promoted_at = NULL, promoted_sha = NULL,
                   last_failure_reason = left('promotion failed: ' || coalesce(p_error, p_outcome), 4000)
             WHERE c.id = v_c.id;
            PERFORM ledger.end_transition();
            PERFORM ledger.exhaust_if_spent(v_c.id);
        END IF;
    END IF;
    RETURN v_state;
END
$$;
