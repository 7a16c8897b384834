-- The verifier's API: claims, heartbeats and verdicts

-- SECURITY DEFINER, pinned search_path, names schema-qualified; grants.sql
-- grants each to this one role. SQLSTATEs: see api_helpers.sql.

-- Claim an attempted campaign for verification (SKIP LOCKED, own short
-- lease). Verifications whose verifier vanished lapse here first. The claim
-- carries the candidate's evidence from the database (its bundle, diff and
-- published ref): a verifier on another machine needs nothing of the
-- worker's disk.
-- A class may require a quorum (campaign_class.verifiers): its kinds are
-- verified one after another, in order, each by a verifier that implements
-- it (p_kinds; NULL: any), one verification row per kind per attempt
-- (verification_one_per_kind); the claim says which kind it is for.
-- Two verifiers never collide on verification_one_running: the campaign row
-- is locked first, and the "no running verification" test is made again,
-- on a fresh snapshot, after the lock (the SELECT's own snapshot predates a
-- verification that another claimer committed while it held the lock).
CREATE OR REPLACE FUNCTION ledger.next_verifier(p_campaign_id bigint, p_generation bigint, p_class text)
    RETURNS text
    LANGUAGE sql
    STABLE
AS $$
    -- the first kind of the class's quorum without an accepted verdict at this generation
    SELECT q.kind
      FROM ledger.campaign_class cc, unnest(cc.verifiers) WITH ORDINALITY AS q(kind, n)
     WHERE cc.name = p_class
       AND NOT EXISTS (SELECT 1 FROM ledger.verification v
                        WHERE v.campaign_id = p_campaign_id AND v.generation = p_generation
                          AND v.kind = q.kind AND v.status = 'accepted')
     ORDER BY q.n
     LIMIT 1
$$;

CREATE OR REPLACE FUNCTION ledger_api.claim_verification(
        p_verifier text, p_model_family text DEFAULT NULL,
        p_lease_s double precision DEFAULT 120, p_classes text[] DEFAULT NULL,
        p_kinds text[] DEFAULT NULL)
    RETURNS TABLE (verification_id bigint, campaign_id bigint, generation bigint,
                   attempt_id bigint, attempt_no integer, class text, objective_key text,
                   target text, base_sha text, candidate_sha text, fingerprint text,
                   bundle jsonb, bundle_digest text, acceptance_criteria jsonb,
                   evidence_location text, worker text, lease_expires_at timestamptz,
                   lease_remaining_s double precision, diff bytea, candidate_ref text,
                   kind text, quorum text[])
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
    v_a ledger.attempt;
    v_id bigint;
    v_expires timestamptz;
    v_passed bigint[] := '{}';
    v_kind text;
    v_quorum text[];
BEGIN
    IF p_verifier IS NULL OR length(p_verifier) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'verifier identity must be 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('lease_s', p_lease_s, 0.001, 86400);
    PERFORM ledger.restart_grace();  -- what lapsed while the server was down is not lost
    UPDATE ledger.verification v
       SET status = 'lost', finished_at = v_now, reason = 'verifier lease expired'
     WHERE v.status = 'running' AND v.lease_expires_at <= v_now;

    FOR i IN 1..10 LOOP
        v_c := NULL;
        SELECT c.* INTO v_c
          FROM ledger.campaign c
         WHERE c.state = 'attempted'
           AND c.next_attempt_at <= v_now  -- a released verification waits out its pause
           AND (p_classes IS NULL OR c.class = ANY (p_classes))
           AND NOT (c.id = ANY (v_passed))
           AND NOT EXISTS (SELECT 1 FROM ledger.verification v
                            WHERE v.campaign_id = c.id AND v.status = 'running')
           AND NOT EXISTS (SELECT 1 FROM ledger.attempt a
                            WHERE a.campaign_id = c.id AND a.generation = c.generation
                              AND a.worker = p_verifier)
           AND (p_kinds IS NULL OR ledger.next_verifier(c.id, c.generation, c.class) = ANY (p_kinds))
           -- limits (limits.sql): no key of it at its cap of verifications
           AND (cardinality(c.limit_keys) = 0 OR NOT EXISTS (
                    SELECT 1 FROM ledger.limit_key k
                     WHERE k.key = ANY (c.limit_keys) AND k.verifying >= k.max_verifying))
         ORDER BY c.priority DESC, c.updated_at, c.id
         LIMIT 1
           FOR UPDATE OF c SKIP LOCKED;
        EXIT WHEN v_c.id IS NULL;
        EXIT WHEN NOT EXISTS (SELECT 1 FROM ledger.verification v
                               WHERE v.campaign_id = v_c.id AND v.status = 'running');
        v_passed := v_passed || v_c.id;  -- claimed a moment ago by another verifier
    END LOOP;
    IF v_c.id IS NULL OR v_c.id = ANY (v_passed) THEN
        RETURN;
    END IF;
    SELECT * INTO v_a FROM ledger.attempt a
     WHERE a.campaign_id = v_c.id AND a.generation = v_c.generation;
    v_kind := ledger.next_verifier(v_c.id, v_c.generation, v_c.class);
    SELECT cc.verifiers INTO v_quorum FROM ledger.campaign_class cc WHERE cc.name = v_c.class;
    IF v_kind IS NULL THEN
        RAISE EXCEPTION 'campaign % has every verdict of its quorum and is still attempted', v_c.id
            USING ERRCODE = 'LG002';
    END IF;
    v_expires := v_now + make_interval(secs => p_lease_s);
    BEGIN
        INSERT INTO ledger.verification (campaign_id, attempt_id, generation, verifier, kind, model_family,
                                         claimed_at, lease_expires_at, lease_s)
        VALUES (v_c.id, v_a.id, v_c.generation, p_verifier, v_kind, p_model_family, v_now, v_expires, p_lease_s)
        RETURNING id INTO v_id;
    EXCEPTION WHEN SQLSTATE 'LG014' THEN
        RETURN;  -- another verifier took the last slot of one of its keys a moment ago
    END;
    PERFORM ledger.append_event(v_c.id, 'verification.started', p_verifier,
                jsonb_build_object('verification_id', v_id, 'attempt_no', v_a.attempt_no,
                                   'model_family', p_model_family, 'kind', v_kind));
    RETURN QUERY SELECT v_id, v_c.id, v_c.generation, v_a.id, v_a.attempt_no, v_c.class,
                        v_c.objective_key, v_c.target, v_a.base_sha, v_a.candidate_sha,
                        v_a.fingerprint, v_a.bundle, v_a.bundle_digest, v_c.acceptance_criteria,
                        v_c.evidence_location, v_a.worker, v_expires, p_lease_s, v_a.diff,
                        v_a.candidate_ref, v_kind, v_quorum;
END
$$;

-- Extend a verification's own lease while it is live (running, unexpired,
-- its campaign still attempted at its generation); returns the new expiry
-- and the lease's length.
CREATE OR REPLACE FUNCTION ledger_api.heartbeat_verification(p_verification_id bigint,
                                                  p_lease_s double precision DEFAULT 120)
    RETURNS TABLE (lease_expires_at timestamptz, lease_remaining_s double precision)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_expires timestamptz;
BEGIN
    IF p_verification_id IS NULL THEN
        RAISE EXCEPTION 'a verification id is required' USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('lease_s', p_lease_s, 0.001, 86400);
    FOR i IN 1..2 LOOP
        UPDATE ledger.verification v
           SET lease_expires_at = v_now + make_interval(secs => p_lease_s), lease_s = p_lease_s
          FROM ledger.campaign c
         WHERE v.id = p_verification_id AND v.status = 'running' AND v.lease_expires_at > v_now
           AND c.id = v.campaign_id AND c.generation = v.generation AND c.state = 'attempted'
        RETURNING v.lease_expires_at INTO v_expires;
        -- not live: once more if the server just came back (ledger.restart_grace)
        EXIT WHEN FOUND OR i = 2 OR NOT ledger.restart_grace();
    END LOOP;
    IF v_expires IS NULL THEN
        RAISE EXCEPTION 'verification % is no longer current (lapsed, ended, or its campaign moved)',
            p_verification_id USING ERRCODE = 'LG001';
    END IF;
    RETURN QUERY SELECT v_expires, p_lease_s;
END
$$;

-- Shared by accept and reject (internal): the verification and its
-- campaign, locked (campaign first, as every writer does).
CREATE OR REPLACE FUNCTION ledger.locked_verification(p_verification_id bigint)
    RETURNS ledger.verification
    LANGUAGE plpgsql
AS $$
DECLARE
    v_v ledger.verification;
BEGIN
    IF p_verification_id IS NULL THEN
        RAISE EXCEPTION 'a verification id is required' USING ERRCODE = 'LG007';
    END IF;
    SELECT * INTO v_v FROM ledger.verification v WHERE v.id = p_verification_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'verification % does not exist', p_verification_id USING ERRCODE = 'LG004';
    END IF;
    PERFORM 1 FROM ledger.campaign c WHERE c.id = v_v.campaign_id FOR UPDATE;
    SELECT * INTO v_v FROM ledger.verification v WHERE v.id = p_verification_id FOR UPDATE;
    RETURN v_v;
END
$$;

-- Refuse a verdict unless the verification is live now (running, its own
-- lease not expired, its campaign still attempted at its generation) and
-- comes from another identity than the attempt's worker.
CREATE OR REPLACE FUNCTION ledger.check_verification_live(p_v ledger.verification)
    RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    v_c ledger.campaign;
    v_worker text;
    v_expires timestamptz;
BEGIN
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_v.campaign_id;
    IF p_v.status <> 'running' OR v_c.generation <> p_v.generation OR v_c.state <> 'attempted' THEN
        RAISE EXCEPTION 'verification % is no longer current (status %, campaign % is % at generation %)',
            p_v.id, p_v.status, v_c.id, v_c.state, v_c.generation
            USING ERRCODE = 'LG001';
    END IF;
    IF p_v.lease_expires_at <= ledger.now() THEN
        -- live again if the server just came back (ledger.restart_grace; read
        -- back by a statement of its own, which sees what the grace wrote)
        IF ledger.restart_grace() THEN
            SELECT v.lease_expires_at INTO v_expires FROM ledger.verification v WHERE v.id = p_v.id;
        END IF;
        IF v_expires IS NULL OR v_expires <= ledger.now() THEN
            RAISE EXCEPTION 'verification % is no longer current: its lease expired at %',
                p_v.id, p_v.lease_expires_at USING ERRCODE = 'LG001';
        END IF;
    END IF;
    SELECT a.worker INTO v_worker FROM ledger.attempt a WHERE a.id = p_v.attempt_id;
    IF v_worker = p_v.verifier THEN
        RAISE EXCEPTION 'a verdict must come from another identity than the worker that made the attempt (%)',
            v_worker USING ERRCODE = 'LG008';
    END IF;
END
$$;

-- The candidate passed this verification. With a quorum, the verdict is
-- recorded and the campaign stays attempted until every kind of it has
-- accepted (NULL returned; the next kind is claimable at once); the last
-- acceptance moves it attempted -> verified. If the class promotes, the
-- promotion intent is committed with that verdict (intent before action),
-- its landing naming every verdict of the quorum -- unless the class's
-- approval policy asks a person first: then the campaign goes on to
-- awaiting_approval with the intent kept for the approval (NULL returned;
-- approval.sql). A retried accept of a verification already accepted
-- returns its intent (or NULL).
CREATE OR REPLACE FUNCTION ledger_api.accept(p_verification_id bigint, p_evidence jsonb DEFAULT '{}')
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_v ledger.verification := ledger.locked_verification(p_verification_id);
    v_a ledger.attempt;
    v_c ledger.campaign;
    v_promotion jsonb;
    v_effect bigint;
    v_quorum text[];
    v_verdicts jsonb;
    v_request jsonb;
    v_reasons jsonb;
BEGIN
    IF v_v.status = 'accepted' THEN
        -- this very verdict, retried: it is in
        RETURN (SELECT s.id FROM ledger.side_effect s
                 WHERE s.campaign_id = v_v.campaign_id AND s.generation = v_v.generation
                   AND s.purpose = 'promotion'
                 ORDER BY s.id DESC LIMIT 1);
    END IF;
    PERFORM ledger.check_verification_live(v_v);
    SELECT * INTO v_a FROM ledger.attempt a WHERE a.id = v_v.attempt_id;
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = v_v.campaign_id;
    SELECT cc.promotion, cc.verifiers INTO v_promotion, v_quorum
      FROM ledger.campaign_class cc WHERE cc.name = v_c.class;

    UPDATE ledger.verification v
       SET status = 'accepted', finished_at = v_now, evidence = coalesce(p_evidence, '{}')
     WHERE v.id = v_v.id;
    IF ledger.next_verifier(v_c.id, v_c.generation, v_c.class) IS NOT NULL THEN
        -- more of the quorum to hear from: the campaign waits for them
        PERFORM ledger.append_event(v_c.id, 'verification.accepted', v_v.verifier,
                    jsonb_build_object('verification_id', v_v.id, 'attempt_no', v_a.attempt_no,
                                       'kind', v_v.kind, 'model_family', v_v.model_family,
                                       'next', ledger.next_verifier(v_c.id, v_c.generation, v_c.class)));
        PERFORM pg_notify('ledger_attempted', v_c.id::text);
        RETURN NULL;
    END IF;
    SELECT jsonb_agg(jsonb_build_object('kind', v.kind, 'verifier', v.verifier,
                                        'model_family', v.model_family,
                                        'summary', left(coalesce(v.evidence ->> 'summary', ''), 500))
                     ORDER BY array_position(v_quorum, v.kind))
      INTO v_verdicts
      FROM ledger.verification v
     WHERE v.campaign_id = v_c.id AND v.generation = v_c.generation AND v.status = 'accepted';
    IF v_promotion ? 'ref' THEN
        -- the promotion the verdicts ask for, frozen here (intent before
        -- action): requested now, or kept with the approval until a person
        -- (or the class's timeout) decides
        v_request := jsonb_build_object(
            'target', v_promotion ->> 'ref',
            'precondition', jsonb_build_object('old', v_a.base_sha),
            'payload', jsonb_build_object(
                'new', v_a.candidate_sha,
                'candidate_ref', v_a.candidate_ref,
                'repository', v_promotion ->> 'repository',
                -- what the landed commit says, frozen here so that every
                -- dispatcher carrying the intent out builds the very same
                -- commit (the candidate's tree with Ledger's trailers)
                'landing', jsonb_build_object(
                    'campaign_id', v_c.id, 'attempt_no', v_a.attempt_no,
                    'verifier', v_v.verifier, 'model_family', v_v.model_family,
                    'summary', left(coalesce(p_evidence ->> 'summary', ''), 500),
                    'verdicts', v_verdicts,
                    'committer', v_promotion -> 'committer',
                    'verified_at', floor(extract(epoch FROM v_now))::bigint)),
            'idempotency_key', format('promote:%s:%s:%s', v_c.id, v_c.generation, v_a.attempt_no));
    END IF;
    -- Does the class want a person to look first (approval.sql)? Then the
    -- attempt's verdict waits for that decision, and nothing is promoted yet.
    v_reasons := ledger.approval_reasons(v_c, v_a);
    IF v_reasons IS NULL THEN
        UPDATE ledger.attempt a SET verdict = 'accepted' WHERE a.id = v_a.id;
    END IF;
    PERFORM ledger.begin_transition('accept', 'verifier', v_v.verifier,
                jsonb_build_object('verification_id', v_v.id, 'attempt_no', v_a.attempt_no,
                                   'candidate_sha', v_a.candidate_sha,
                                   'model_family', v_v.model_family));
    UPDATE ledger.campaign c
       SET state = 'verified',
           -- nothing to promote: the verdict itself is the point after which
           -- an observation may confirm (once approved, if it must be)
           promoted_at = CASE WHEN v_promotion ? 'ref' OR v_reasons IS NOT NULL THEN NULL ELSE v_now END,
           promoted_sha = CASE WHEN v_promotion ? 'ref' OR v_reasons IS NOT NULL THEN NULL
                               ELSE v_a.candidate_sha END
     WHERE c.id = v_c.id;
    PERFORM ledger.end_transition();

    IF v_reasons IS NOT NULL THEN
        PERFORM ledger.request_approval(v_c.id, v_a.id, v_reasons, v_request);
        RETURN NULL;
    END IF;
    IF v_request IS NOT NULL THEN
        v_effect := ledger.request_promotion(v_c.id, v_c.generation, v_request, v_v.verifier, 'verifier');
    END IF;
    RETURN v_effect;
END
$$;

-- The candidate failed: attempted -> ready (maybe -> exhausted). Its
-- fingerprint can never be recorded again on this campaign. A retried
-- reject with the same reason returns the state it left.
CREATE OR REPLACE FUNCTION ledger_api.reject(p_verification_id bigint, p_reason text,
                                             p_evidence jsonb DEFAULT '{}')
    RETURNS text
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
BEGIN
    IF coalesce(p_reason, '') = '' THEN
        RAISE EXCEPTION 'a rejection needs a reason' USING ERRCODE = 'LG007';
    END IF;
    v_v := ledger.locked_verification(p_verification_id);
    IF v_v.status = 'rejected' AND v_v.reason = left(p_reason, 4000) THEN
        -- this very verdict, retried: it is in
        RETURN coalesce(ledger.ended_as(v_v.campaign_id, v_v.generation, 'reject'),
                        ledger.ended_as(v_v.campaign_id, v_v.generation, 'requeue'), 'ready');
    END IF;
    PERFORM ledger.check_verification_live(v_v);
    IF ledger.merge_queue_requeue(v_v, p_reason, p_evidence) THEN
        RETURN 'verified';  -- a merge queue's stack failed: bisected, nothing charged
    END IF;
    SELECT * INTO v_a FROM ledger.attempt a WHERE a.id = v_v.attempt_id;
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = v_v.campaign_id;
    UPDATE ledger.verification v
       SET status = 'rejected', finished_at = v_now, reason = left(p_reason, 4000),
           evidence = coalesce(p_evidence, '{}')
     WHERE v.id = v_v.id;
    UPDATE ledger.attempt a SET verdict = 'rejected' WHERE a.id = v_a.id;
    PERFORM ledger.begin_transition('reject', 'verifier', v_v.verifier,
                jsonb_build_object('verification_id', v_v.id, 'attempt_no', v_a.attempt_no,
                                   'fingerprint', v_a.fingerprint, 'reason', left(p_reason, 4000)));
    UPDATE ledger.campaign c
       SET state = 'ready', next_attempt_at = v_now + ledger.backoff(c.class, c.attempt_count),
           last_failure_reason = left('rejected: ' || p_reason, 4000)
     WHERE c.id = v_c.id;
    PERFORM ledger.end_transition();
    IF ledger.exhaust_if_spent(v_c.id) THEN
        RETURN 'exhausted';
    END IF;
    RETURN 'ready';
END
$$;

-- The check could not be made for a reason that is not the candidate's: the
-- remote or the candidate's ref cannot be reached, the verifier's own
-- configuration or code failed. No verdict: the verification ends as
-- released, the campaign stays attempted (nothing charged, no approach
-- refused), says why it waits (waiting_on = 'system_fault'), and is
-- verified again after a pause (2 s, doubling with the faults in a row, at
-- most 5 minutes; p_retry_after_s overrides it). An identical retry returns
-- the first result.
CREATE OR REPLACE FUNCTION ledger_api.release_verification(
        p_verification_id bigint, p_reason text, p_retry_after_s double precision DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_v ledger.verification;
    v_c ledger.campaign;
    v_next timestamptz;
BEGIN
    IF p_reason IS NULL OR length(p_reason) NOT BETWEEN 1 AND 4000 THEN
        RAISE EXCEPTION 'a released verification needs a reason (1 to 4000 characters)'
            USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('retry_after_s', p_retry_after_s, 0, 86400, true);
    v_v := ledger.locked_verification(p_verification_id);
    IF v_v.status = 'released' AND v_v.reason = p_reason THEN
        RETURN 'attempted';  -- this very release, retried: it is in
    END IF;
    IF v_v.status <> 'running' OR v_v.lease_expires_at <= v_now THEN
        RAISE EXCEPTION 'verification % is no longer current (status %)', v_v.id, v_v.status
            USING ERRCODE = 'LG001';
    END IF;
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = v_v.campaign_id;
    IF v_c.state <> 'attempted' OR v_c.generation <> v_v.generation THEN
        RAISE EXCEPTION 'verification % is no longer current (campaign % is % at generation %)',
            v_v.id, v_c.id, v_c.state, v_c.generation USING ERRCODE = 'LG001';
    END IF;
    v_next := v_now + make_interval(secs => coalesce(p_retry_after_s,
                                                     least(300, 2 * power(2, least(v_c.fault_count, 20)))));
    UPDATE ledger.verification v
       SET status = 'released', finished_at = v_now, reason = p_reason
     WHERE v.id = v_v.id;
    UPDATE ledger.campaign c
       SET next_attempt_at = v_next, fault_count = c.fault_count + 1,
           waiting_on = 'system_fault', waiting_reason = left('verification: ' || p_reason, 4000),
           waiting_since = coalesce(c.waiting_since, v_now)
     WHERE c.id = v_c.id;
    PERFORM ledger.append_event(v_c.id, 'verification.released', v_v.verifier,
                jsonb_build_object('verification_id', v_v.id, 'reason', p_reason,
                                   'system_fault', true, 'retry_at', v_next));
    RETURN 'attempted';
END
$$;
