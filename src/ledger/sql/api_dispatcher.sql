-- The dispatcher's API (the outbox)

-- SECURITY DEFINER, pinned search_path, names schema-qualified; grants.sql
-- grants each to this one role. SQLSTATEs: see api_helpers.sql.

CREATE OR REPLACE FUNCTION ledger_api.claim_side_effect(p_dispatcher text,
                                             p_lease_s double precision DEFAULT 60,
                                             p_kinds text[] DEFAULT NULL)
    RETURNS TABLE (side_effect_id bigint, claim_token bigint, campaign_id bigint,
                   generation bigint, kind text, purpose text, target text,
                   precondition jsonb, payload jsonb, idempotency_key text, tries integer)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
BEGIN
    IF p_dispatcher IS NULL OR length(p_dispatcher) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'dispatcher identity must be 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    RETURN QUERY
    UPDATE ledger.side_effect s
       SET state = 'claimed', claimed_by = p_dispatcher, claim_token = s.claim_token + 1,
           lease_expires_at = v_now + make_interval(secs => p_lease_s), tries = s.tries + 1,
           updated_at = v_now
     WHERE s.id = (
           SELECT o.id FROM ledger.side_effect o
            WHERE ((o.state = 'pending' AND o.next_try_at <= v_now)
                   OR (o.state = 'claimed' AND o.lease_expires_at < v_now))
              AND (p_kinds IS NULL OR o.kind = ANY (p_kinds))
            ORDER BY o.next_try_at, o.id
            LIMIT 1
              FOR UPDATE SKIP LOCKED)
    RETURNING s.id, s.claim_token, s.campaign_id, s.generation, s.kind, s.purpose, s.target,
              s.precondition, s.payload, s.idempotency_key, s.tries;
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
