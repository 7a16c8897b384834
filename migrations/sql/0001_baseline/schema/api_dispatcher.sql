-- The dispatcher's API (the outbox)

-- SECURITY DEFINER, pinned search_path, names schema-qualified; grants.sql
-- grants each to this one role. SQLSTATEs: see api_helpers.sql.

-- Claim the next due intent whose generation is still live (the journal
-- trigger cancels pending intents of a generation that ended; a claimed one
-- whose dispatcher vanished and whose generation died is cancelled here).
CREATE OR REPLACE FUNCTION ledger_api.claim_side_effect(p_dispatcher text,
                                             p_lease_s double precision DEFAULT 60,
                                             p_kinds text[] DEFAULT NULL)
    RETURNS TABLE (side_effect_id bigint, claim_token bigint, campaign_id bigint,
                   generation bigint, kind text, purpose text, target text,
                   precondition jsonb, payload jsonb, idempotency_key text, tries integer,
                   lease_expires_at timestamptz, lease_remaining_s double precision)
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
    PERFORM ledger.check_range('lease_s', p_lease_s, 0.001, 86400);
    UPDATE ledger.side_effect s
       SET state = 'cancelled', claimed_by = NULL, lease_expires_at = NULL,
           finished_at = v_now, updated_at = v_now,
           error = format('generation %s of the campaign ended before it was carried out', s.generation)
      FROM ledger.campaign c
     WHERE s.state = 'claimed' AND s.lease_expires_at <= v_now
       AND c.id = s.campaign_id AND NOT ledger.generation_live(c, s.generation);
    RETURN QUERY
    UPDATE ledger.side_effect s
       SET state = 'claimed', claimed_by = p_dispatcher, claim_token = s.claim_token + 1,
           lease_expires_at = v_now + make_interval(secs => p_lease_s), tries = s.tries + 1,
           updated_at = v_now
     WHERE s.id = (
           SELECT o.id FROM ledger.side_effect o
             JOIN ledger.campaign c ON c.id = o.campaign_id
            WHERE ((o.state = 'pending' AND o.next_try_at <= v_now)
                   OR (o.state = 'claimed' AND o.lease_expires_at <= v_now))
              AND (p_kinds IS NULL OR o.kind = ANY (p_kinds))
              AND ledger.generation_live(c, o.generation)
            ORDER BY o.next_try_at, o.id
            LIMIT 1
              FOR UPDATE OF o SKIP LOCKED)
    RETURNING s.id, s.claim_token, s.campaign_id, s.generation, s.kind, s.purpose, s.target,
              s.precondition, s.payload, s.idempotency_key, s.tries, s.lease_expires_at, p_lease_s;
END
$$;

-- Just before acting: the claim must still be this dispatcher's (token,
-- unexpired lease) and the intent's generation still live. Extends the
-- claim's lease. Answers 'live', 'lost' (the claim is gone: do not act) or
-- 'cancelled' (the generation died: the intent is cancelled and journaled
-- here, and committed -- hence an answer, not an error).
CREATE OR REPLACE FUNCTION ledger_api.confirm_side_effect(p_side_effect_id bigint, p_claim_token bigint,
                                               p_lease_s double precision DEFAULT 60)
    RETURNS TABLE (status text, lease_expires_at timestamptz, lease_remaining_s double precision)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_s ledger.side_effect;
    v_c ledger.campaign;
BEGIN
    IF p_side_effect_id IS NULL OR p_claim_token IS NULL THEN
        RAISE EXCEPTION 'a side effect id and claim token are required' USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('lease_s', p_lease_s, 0.001, 86400);
    SELECT * INTO v_s FROM ledger.side_effect s WHERE s.id = p_side_effect_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'side effect % does not exist', p_side_effect_id USING ERRCODE = 'LG004';
    END IF;
    -- lock order: campaign, then side effect (as abandon does)
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = v_s.campaign_id FOR UPDATE;
    SELECT * INTO v_s FROM ledger.side_effect s WHERE s.id = p_side_effect_id FOR UPDATE;
    IF v_s.state <> 'claimed' OR v_s.claim_token <> p_claim_token OR v_s.lease_expires_at <= v_now THEN
        RETURN QUERY SELECT 'lost'::text, NULL::timestamptz, NULL::double precision;
        RETURN;
    END IF;
    IF NOT ledger.generation_live(v_c, v_s.generation) THEN
        UPDATE ledger.side_effect s
           SET state = 'cancelled', claimed_by = NULL, lease_expires_at = NULL,
               finished_at = v_now, updated_at = v_now,
               error = format('generation %s is no longer live (the campaign is %s at generation %s)',
                              v_s.generation, v_c.state, v_c.generation)
         WHERE s.id = v_s.id;
        IF NOT (SELECT st.is_terminal FROM ledger.state st WHERE st.name = v_c.state) THEN
            PERFORM ledger.append_event(v_c.id, 'side_effect.cancelled', v_s.claimed_by,
                        jsonb_build_object('side_effect_id', v_s.id, 'kind', v_s.kind,
                                           'target', v_s.target, 'generation', v_s.generation));
        END IF;
        RETURN QUERY SELECT 'cancelled'::text, NULL::timestamptz, NULL::double precision;
        RETURN;
    END IF;
    UPDATE ledger.side_effect s
       SET lease_expires_at = v_now + make_interval(secs => p_lease_s), updated_at = v_now
     WHERE s.id = v_s.id;
    RETURN QUERY SELECT 'live'::text, v_now + make_interval(secs => p_lease_s), p_lease_s;
END
$$;

-- Record what the dispatcher saw when it read the target back:
--   done     the target shows the effect (read back in p_result)
--   conflict the precondition failed; never retried blindly
--   retry    a transient failure; try again after p_retry_after_s
--   failed   a permanent failure
-- Needs the live claim (token and unexpired lease); a retried identical
-- record returns the state it left.
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
    IF p_side_effect_id IS NULL OR p_claim_token IS NULL THEN
        RAISE EXCEPTION 'a side effect id and claim token are required' USING ERRCODE = 'LG007';
    END IF;
    IF p_outcome IS NULL OR p_outcome NOT IN ('done', 'conflict', 'retry', 'failed') THEN
        RAISE EXCEPTION 'outcome must be done, conflict, retry or failed' USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('retry_after_s', p_retry_after_s, 0, 604800);
    v_state := CASE p_outcome WHEN 'retry' THEN 'pending' ELSE p_outcome END;
    SELECT * INTO v_s FROM ledger.side_effect s WHERE s.id = p_side_effect_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'side effect % does not exist', p_side_effect_id USING ERRCODE = 'LG004';
    END IF;
    -- lock order: campaign, then side effect (as abandon does)
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = v_s.campaign_id FOR UPDATE;
    SELECT * INTO v_s FROM ledger.side_effect s WHERE s.id = p_side_effect_id FOR UPDATE;
    IF v_s.claim_token = p_claim_token AND v_s.state = v_state AND v_s.claimed_by IS NULL
       AND v_s.result IS NOT DISTINCT FROM coalesce(p_result, '{}') THEN
        RETURN v_state;  -- this very record, retried: it is in
    END IF;
    IF v_s.state <> 'claimed' OR v_s.claim_token <> p_claim_token OR v_s.lease_expires_at <= v_now THEN
        RAISE EXCEPTION 'side effect % is no longer claimed by this dispatcher (state %)',
            p_side_effect_id, v_s.state USING ERRCODE = 'LG001';
    END IF;
    UPDATE ledger.side_effect s
       SET state = v_state,
           claimed_by = NULL, lease_expires_at = NULL,
           result = coalesce(p_result, '{}'), error = left(p_error, 4000),
           next_try_at = CASE WHEN p_outcome = 'retry'
                              THEN v_now + make_interval(secs => p_retry_after_s)
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
            -- a promotion lands its own commit (the candidate's tree with
            -- Ledger's trailers): promoted_sha is the one read back
            UPDATE ledger.campaign c
               SET promoted_at = v_now,
                   promoted_sha = CASE WHEN p_result ->> 'landed' ~ '^[0-9a-f]{40}([0-9a-f]{24})?$'
                                       THEN p_result ->> 'landed'
                                       ELSE v_s.payload ->> 'new' END
             WHERE c.id = v_c.id;
        ELSIF p_outcome IN ('conflict', 'failed') THEN
            -- An accepted candidate that could not land is no failed attempt:
            -- the campaign gets the attempt back (one more allowed), so a
            -- target that keeps moving cannot exhaust it.
            PERFORM ledger.begin_transition('promote_failed', 'dispatcher', v_s.claimed_by,
                        jsonb_build_object('side_effect_id', v_s.id, 'outcome', p_outcome,
                                           'result', coalesce(p_result, '{}'), 'error', p_error,
                                           'attempt_given_back', true));
            UPDATE ledger.campaign c
               SET state = 'ready', next_attempt_at = v_now, promoted_at = NULL, promoted_sha = NULL,
                   max_attempts = c.max_attempts + 1,
                   last_failure_reason = left('promotion failed: ' || coalesce(p_error, p_outcome), 4000)
             WHERE c.id = v_c.id;
            PERFORM ledger.end_transition();
        END IF;
    END IF;
    RETURN v_state;
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.rebase_promotion(
        p_side_effect_id bigint, p_claim_token bigint, p_base_sha text, p_candidate_sha text,
        p_bundle jsonb, p_bundle_digest text, p_evidence_location text)
    RETURNS TABLE (campaign_id bigint, attempt_no integer, generation bigint)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_s ledger.side_effect;
    v_c ledger.campaign;
    v_a ledger.attempt;
    v_attempt_no integer;
BEGIN
    IF p_side_effect_id IS NULL OR p_claim_token IS NULL THEN
        RAISE EXCEPTION 'a side effect id and claim token are required' USING ERRCODE = 'LG007';
    END IF;
    IF p_candidate_sha IS NULL OR p_candidate_sha !~ '^[0-9a-f]{7,64}$'
       OR p_base_sha IS NULL OR p_base_sha !~ '^[0-9a-f]{7,64}$' THEN
        RAISE EXCEPTION 'candidate and base must be hexadecimal commit ids' USING ERRCODE = 'LG007';
    END IF;
    IF p_bundle IS NULL OR jsonb_typeof(p_bundle) <> 'object' OR coalesce(p_bundle_digest, '') = ''
       OR coalesce(p_evidence_location, '') = '' THEN
        RAISE EXCEPTION 'a rebased candidate needs its frozen bundle, digest and evidence location'
            USING ERRCODE = 'LG007';
    END IF;
    SELECT * INTO v_s FROM ledger.side_effect s WHERE s.id = p_side_effect_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'side effect % does not exist', p_side_effect_id USING ERRCODE = 'LG004';
    END IF;
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = v_s.campaign_id FOR UPDATE;
    SELECT * INTO v_s FROM ledger.side_effect s WHERE s.id = p_side_effect_id FOR UPDATE;
    IF v_s.state <> 'claimed' OR v_s.claim_token <> p_claim_token OR v_s.lease_expires_at <= v_now THEN
        RAISE EXCEPTION 'side effect % is no longer claimed by this dispatcher (state %)',
            p_side_effect_id, v_s.state USING ERRCODE = 'LG001';
    END IF;
    IF v_s.purpose <> 'promotion' OR v_c.state <> 'verified' OR v_c.generation <> v_s.generation THEN
        RAISE EXCEPTION 'side effect % is not the live promotion of campaign % (it is %, generation %)',
            p_side_effect_id, v_c.id, v_c.state, v_c.generation USING ERRCODE = 'LG002';
    END IF;
    SELECT * INTO v_a FROM ledger.attempt a
     WHERE a.campaign_id = v_c.id AND a.generation = v_c.generation;
    SELECT max(a.attempt_no) + 1 INTO v_attempt_no FROM ledger.attempt a WHERE a.campaign_id = v_c.id;
    IF (p_bundle ->> 'attempt_no')::integer IS DISTINCT FROM v_attempt_no
       OR (p_bundle ->> 'generation')::bigint IS DISTINCT FROM v_c.generation + 1
       OR (p_bundle ->> 'candidate_sha') IS DISTINCT FROM p_candidate_sha THEN
        RAISE EXCEPTION 'the bundle must describe attempt % at generation % with candidate %',
            v_attempt_no, v_c.generation + 1, p_candidate_sha USING ERRCODE = 'LG007';
    END IF;
    UPDATE ledger.side_effect s
       SET state = 'conflict', claimed_by = NULL, lease_expires_at = NULL,
           result = jsonb_build_object('rebased_onto', p_base_sha, 'candidate', p_candidate_sha),
           error = 'the target moved: rebased and sent back for verification',
           finished_at = v_now, updated_at = v_now
     WHERE s.id = v_s.id;
    PERFORM ledger.begin_transition('rebase', 'dispatcher', v_s.claimed_by,
                jsonb_build_object('side_effect_id', v_s.id, 'attempt_no', v_attempt_no,
                                   'from_candidate', v_a.candidate_sha, 'candidate_sha', p_candidate_sha,
                                   'base_sha', p_base_sha));
    UPDATE ledger.campaign c
       SET state = 'attempted', generation = c.generation + 1,
           promoted_at = NULL, promoted_sha = NULL, evidence_location = p_evidence_location,
           last_failure_reason = NULL
     WHERE c.id = v_c.id;
    PERFORM ledger.end_transition();
    -- The rebased candidate is the same approach, made again by the
    -- dispatcher: its own attempt row, which the budget does not count.
    INSERT INTO ledger.attempt (campaign_id, attempt_no, generation, worker, claimed_at, lease_expires_at,
                                outcome, ended_at, fingerprint, base_sha, candidate_sha, bundle,
                                bundle_digest, log_tail)
    VALUES (v_c.id, v_attempt_no, v_c.generation + 1, v_s.claimed_by, v_now, v_now,
            'attempted', v_now, v_a.fingerprint, p_base_sha, p_candidate_sha, p_bundle,
            p_bundle_digest, format('rebased from %s onto %s', v_a.candidate_sha, p_base_sha));
    RETURN QUERY SELECT v_c.id, v_attempt_no, v_c.generation + 1;
END
$$;
