-- The dispatcher's API (the outbox)

-- SECURITY DEFINER, pinned search_path, names schema-qualified; grants.sql
-- grants each to this one role. SQLSTATEs: see api_helpers.sql.

-- Claim the next due intent whose generation is still live (the journal
-- trigger cancels pending intents of a generation that ended; a claimed one
-- whose dispatcher vanished and whose generation died is cancelled here).
-- A campaign awaiting approval has no promotion to hand out (approval.sql);
-- its other intents (the approval's notice) go only to a dispatcher that
-- says it knows that state (p_approvals: a release before approvals would
-- read the campaign and not know what it is).
CREATE OR REPLACE FUNCTION ledger_api.claim_side_effect(p_dispatcher text,
                                             p_lease_s double precision DEFAULT 60,
                                             p_kinds text[] DEFAULT NULL,
                                             p_approvals boolean DEFAULT false)
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
              AND (p_approvals OR c.state <> 'awaiting_approval')
              AND ledger.merge_queue_turn(o)  -- a queued promotion only in its turn
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
--   failed   a permanent failure (of a live promotion: no verdict on its
--            candidate -- the promotion is tried again after a pause, and
--            'pending' is returned)
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
           -- a retry that waits on a fault outside the effect (its remote
           -- down, its target's checkout dirty) is no try: waiting never
           -- turns into giving up
           tries = CASE WHEN p_outcome = 'retry' AND p_result ? 'waiting_on'
                        THEN greatest(s.tries - 1, 0) ELSE s.tries END,
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
                                       ELSE v_s.payload ->> 'new' END,
                   waiting_on = NULL, waiting_reason = NULL, waiting_since = NULL, fault_count = 0
             WHERE c.id = v_c.id;
        ELSIF p_outcome = 'retry' THEN
            -- The promotion waits (a remote that cannot be reached, a dirty
            -- checkout of the target, a lock): the candidate stays verified,
            -- nothing is re-attempted, and the campaign says why.
            UPDATE ledger.campaign c
               SET waiting_on = CASE WHEN p_result ->> 'waiting_on' = 'target' THEN 'target'
                                     ELSE 'system_fault' END,
                   waiting_reason = left('promotion: ' || coalesce(p_error, 'retrying'), 4000),
                   waiting_since = coalesce(c.waiting_since, v_now),
                   fault_count = c.fault_count + CASE WHEN p_result ? 'waiting_on' THEN 1 ELSE 0 END
             WHERE c.id = v_c.id;
        ELSIF p_outcome = 'failed' THEN
            -- A promotion that failed for a reason outside the candidate (a
            -- dispatcher that gave up on a ref's lock or crashed on it, a
            -- commit it could not build) is no verdict on the candidate, and
            -- no reason to attempt it again: it stays verified, the campaign
            -- waits on a system fault, and the promotion is tried again
            -- after a pause (2 s, doubling with the faults in a row, at most
            -- 5 minutes), with fresh tries. (Sending it back to be attempted,
            -- its attempt given back, let a failing promotion make attempts
            -- without end: the budget bounded nothing.)
            UPDATE ledger.side_effect s
               SET state = 'pending', tries = 0, finished_at = NULL,
                   next_try_at = v_now + make_interval(
                       secs => least(300, 2 * power(2, least(v_c.fault_count, 20))))
             WHERE s.id = v_s.id;
            UPDATE ledger.campaign c
               SET waiting_on = 'system_fault',
                   waiting_reason = left('promotion failed: ' || coalesce(p_error, 'failed'), 4000),
                   waiting_since = coalesce(c.waiting_since, v_now), fault_count = c.fault_count + 1
             WHERE c.id = v_c.id;
            RETURN 'pending';
        ELSIF p_outcome = 'conflict' THEN
            -- An accepted candidate that could not land (its target moved
            -- and it does not apply there) is no failed attempt: the campaign
            -- gets the spent attempt back (the transition's charge is -1),
            -- so a target that keeps moving cannot exhaust it.
            PERFORM ledger.begin_transition('promote_failed', 'dispatcher', v_s.claimed_by,
                        jsonb_build_object('side_effect_id', v_s.id, 'outcome', p_outcome,
                                           'result', coalesce(p_result, '{}'), 'error', p_error,
                                           'attempt_given_back', true));
            UPDATE ledger.campaign c
               SET state = 'ready', next_attempt_at = v_now, promoted_at = NULL, promoted_sha = NULL,
                   attempt_count = c.attempt_count - 1,
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
        p_bundle jsonb, p_bundle_digest text, p_evidence_location text DEFAULT NULL,
        p_diff bytea DEFAULT NULL, p_candidate_ref text DEFAULT NULL)
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
    IF p_bundle IS NULL OR jsonb_typeof(p_bundle) <> 'object' OR coalesce(p_bundle_digest, '') = '' THEN
        RAISE EXCEPTION 'a rebased candidate needs its frozen bundle and digest'
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
    -- rebase_verified refuses anything but this campaign's live promotion (LG002)
    v_attempt_no := ledger.rebase_verified(v_c, v_s, v_s.claimed_by, p_base_sha, p_candidate_sha,
                                           p_bundle, p_bundle_digest, p_evidence_location, p_diff,
                                           p_candidate_ref,
                                           'the target moved: rebased and sent back for verification');
    RETURN QUERY SELECT v_c.id, v_attempt_no, v_c.generation + 1;
END
$$;
