-- 0008 down: the 0007 fence back (functions as 0004/0006/0007 left them).
DROP FUNCTION IF EXISTS ledger_api.confirm_side_effect(bigint, bigint, double precision);
DROP FUNCTION IF EXISTS ledger_api.rebase_promotion(bigint, bigint, text, text, jsonb, text, text);
DELETE FROM ledger.transition WHERE name = 'rebase';
DROP FUNCTION IF EXISTS ledger_api.claim_campaign(text, text[]);
DROP FUNCTION IF EXISTS ledger_api.claim_campaigns(text, text[], integer);
DROP FUNCTION IF EXISTS ledger_api.heartbeat(bigint, bigint);
DROP FUNCTION IF EXISTS ledger_api.append_events(bigint, bigint, jsonb, text);
DROP FUNCTION IF EXISTS ledger_api.claim_verification(text, text, double precision, text[]);
DROP FUNCTION IF EXISTS ledger_api.heartbeat_verification(bigint, double precision);
DROP FUNCTION IF EXISTS ledger_api.claim_side_effect(text, double precision, text[]);
DROP FUNCTION IF EXISTS ledger_api.open_campaign(text, text, text, jsonb, jsonb, integer, text, text[], jsonb, text);
DROP FUNCTION IF EXISTS ledger.open_campaign(text, text, text, jsonb, jsonb, integer, text, text[], jsonb, text, boolean);
DROP FUNCTION IF EXISTS ledger_api.record_observation(text, text, text, text, timestamptz, timestamptz, jsonb, text, timestamptz, text, text, jsonb, text[]);
DROP FUNCTION IF EXISTS ledger_api.accept(bigint, jsonb);
DROP FUNCTION IF EXISTS ledger_api.reject(bigint, text, jsonb);
DROP FUNCTION IF EXISTS ledger.locked_verification(bigint);
DROP FUNCTION IF EXISTS ledger.check_verification_live(ledger.verification);

CREATE OR REPLACE FUNCTION ledger.raise_stale(p_campaign_id bigint, p_generation bigint) RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_state text;
    v_generation bigint;
BEGIN
    SELECT c.state, c.generation INTO v_state, v_generation
      FROM ledger.campaign c WHERE c.id = p_campaign_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign % does not exist', p_campaign_id USING ERRCODE = 'LG004';
    END IF;
    RAISE EXCEPTION 'stale lease on campaign %: generation % is not current (generation %, state %)',
        p_campaign_id, p_generation, v_generation, v_state
        USING ERRCODE = 'LG001',
              DETAIL = json_build_object('generation', v_generation, 'state', v_state)::text;
END
$$;

CREATE OR REPLACE FUNCTION ledger.campaign_journal() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    v_from text := CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END;
    v_name text := current_setting('ledger.transition', true);
    v_detail jsonb := coalesce(nullif(current_setting('ledger.detail', true), '')::jsonb, '{}');
    v_actor text := coalesce(nullif(current_setting('ledger.actor', true), ''), 'system');
BEGIN
    IF v_name = 'record_attempt' THEN
        -- The event describes the attempt it records, read from the row this
        -- transaction just ended, by the lease holder it was recorded for:
        -- so one UPDATE can record a whole batch (record_attempts).
        SELECT jsonb_build_object('attempt_no', a.attempt_no, 'fingerprint', a.fingerprint,
                                  'candidate_sha', a.candidate_sha, 'base_sha', a.base_sha)
          INTO v_detail
          FROM ledger.attempt a WHERE a.campaign_id = NEW.id AND a.generation = OLD.generation;
        v_actor := coalesce(OLD.lease_owner, v_actor);
    END IF;
    INSERT INTO ledger.campaign_event (campaign_id, seq, type, actor, generation, payload, created_at)
    VALUES (NEW.id, NEW.event_seq, 'transition', v_actor,
            NEW.generation,
            v_detail || jsonb_build_object(
                'transition', v_name,
                'from', v_from, 'to', NEW.state,
                'attempt_count', NEW.attempt_count),
            ledger.now());
    -- Hints only (mechanism 5); payloads are ids.
    IF NEW.state = 'ready' THEN
        PERFORM pg_notify('ledger_ready', NEW.id::text);
    END IF;
    IF v_from = 'leased' AND NEW.state <> 'attempted' AND NEW.generation > OLD.generation THEN
        -- the lease holder was fenced out (reaped or abandoned): tell it to stop
        PERFORM pg_notify('ledger_cancel', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION ledger.open_campaign(
        p_class text, p_objective_key text, p_target text, p_desired_state jsonb,
        p_observation jsonb, p_priority integer, p_seat text, p_labels text[],
        p_acceptance jsonb, p_sensor text)
    RETURNS TABLE (campaign_id bigint, created boolean, state text, generation bigint)
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_class ledger.campaign_class;
    v_id bigint;
    v_existing ledger.campaign;
BEGIN
    SELECT * INTO v_class FROM ledger.campaign_class cc WHERE cc.name = p_class;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign class % is not registered (run: ledger classes sync)', p_class
            USING ERRCODE = 'LG004';
    END IF;
    FOR i IN 1..3 LOOP
        PERFORM ledger.begin_transition('open', 'sensor', p_sensor,
                                        jsonb_build_object('observation', coalesce(p_observation, '{}')));
        INSERT INTO ledger.campaign AS c
               (class, objective_key, target, desired_state, opening_observation, state,
                max_attempts, next_attempt_at, acceptance_criteria, seat, priority, labels,
                created_at, updated_at)
        VALUES (p_class, p_objective_key, p_target, coalesce(p_desired_state, '{}'),
                coalesce(p_observation, '{}'), 'ready', v_class.max_attempts, ledger.now(),
                coalesce(p_acceptance, v_class.acceptance),
                coalesce(p_seat, CASE v_class.seat_policy WHEN 'target' THEN p_target END),
                coalesce(p_priority, 0), coalesce(p_labels, '{}'), ledger.now(), ledger.now())
        ON CONFLICT (objective_key) WHERE c.state NOT IN ('confirmed', 'dismissed', 'abandoned')
        DO NOTHING
        RETURNING c.id INTO v_id;
        PERFORM ledger.end_transition();
        IF v_id IS NOT NULL THEN
            RETURN QUERY SELECT v_id, true, 'ready'::text, 0::bigint;
            RETURN;
        END IF;
        SELECT * INTO v_existing FROM ledger.campaign c
         WHERE c.objective_key = p_objective_key
           AND c.state NOT IN ('confirmed', 'dismissed', 'abandoned');
        IF FOUND THEN
            IF v_existing.class <> p_class OR v_existing.target <> p_target THEN
                RAISE EXCEPTION 'objective % is already open as campaign % (class %, target %)',
                    p_objective_key, v_existing.id, v_existing.class, v_existing.target
                    USING ERRCODE = 'LG005';
            END IF;
            RETURN QUERY SELECT v_existing.id, false, v_existing.state, v_existing.generation;
            RETURN;
        END IF;
        -- the conflicting campaign closed between our insert and our read: retry
    END LOOP;
    RAISE EXCEPTION 'could not open objective % (it kept changing)', p_objective_key
        USING ERRCODE = '40001';
END
$$;

CREATE OR REPLACE FUNCTION ledger.current_verification(p_verification_id bigint)
    RETURNS ledger.verification
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_v ledger.verification;
    v_c ledger.campaign;
    v_worker text;
BEGIN
    SELECT * INTO v_v FROM ledger.verification v WHERE v.id = p_verification_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'verification % does not exist', p_verification_id USING ERRCODE = 'LG004';
    END IF;
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = v_v.campaign_id FOR UPDATE;
    SELECT * INTO v_v FROM ledger.verification v WHERE v.id = p_verification_id FOR UPDATE;
    IF v_v.status <> 'running' OR v_c.generation <> v_v.generation OR v_c.state <> 'attempted' THEN
        RAISE EXCEPTION 'verification % is no longer current (status %, campaign % is % at generation %)',
            p_verification_id, v_v.status, v_c.id, v_c.state, v_c.generation
            USING ERRCODE = 'LG001';
    END IF;
    SELECT a.worker INTO v_worker FROM ledger.attempt a WHERE a.id = v_v.attempt_id;
    IF v_worker = v_v.verifier THEN
        RAISE EXCEPTION 'a verdict must come from another identity than the worker that made the attempt (%)',
            v_worker USING ERRCODE = 'LG008';
    END IF;
    RETURN v_v;
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.abandon(p_campaign_id bigint, p_reason text DEFAULT 'abandoned by operator',
                                   p_operator text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
BEGIN
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign % does not exist', p_campaign_id USING ERRCODE = 'LG004';
    END IF;
    PERFORM ledger.begin_transition('abandon', 'operator', coalesce(p_operator, 'operator'),
                jsonb_build_object('reason', p_reason, 'worker', v_c.lease_owner));
    UPDATE ledger.campaign c
       SET state = 'abandoned', generation = c.generation + 1,
           lease_owner = NULL, leased_at = NULL, lease_expires_at = NULL
     WHERE c.id = p_campaign_id;
    PERFORM ledger.end_transition();
    UPDATE ledger.attempt a SET outcome = 'abandoned', ended_at = v_now, failure_reason = p_reason
     WHERE a.campaign_id = p_campaign_id AND a.outcome = 'running';
    UPDATE ledger.verification v SET status = 'abandoned', finished_at = v_now, reason = p_reason
     WHERE v.campaign_id = p_campaign_id AND v.status = 'running';
    UPDATE ledger.side_effect s SET state = 'cancelled', finished_at = v_now, updated_at = v_now,
           error = 'campaign abandoned'
     WHERE s.campaign_id = p_campaign_id AND s.state = 'pending';
    RETURN v_c.generation + 1;
END
$$;

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

CREATE OR REPLACE FUNCTION ledger_api.append_events(p_campaign_id bigint, p_generation bigint, p_events jsonb)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_n integer;
    v_last bigint;
BEGIN
    IF jsonb_typeof(p_events) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'events must be a JSON array' USING ERRCODE = 'LG007';
    END IF;
    v_n := jsonb_array_length(p_events);
    IF v_n = 0 OR v_n > 1000 THEN
        RAISE EXCEPTION 'append 1 to 1000 events at a time, not %', v_n USING ERRCODE = 'LG007';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_events) e
                WHERE jsonb_typeof(e) <> 'object'
                   OR coalesce(e ->> 'type', '') !~ '^[a-z][a-z0-9_.]{0,63}$'
                   OR e ->> 'type' = 'transition'
                   OR (e ? 'payload' AND jsonb_typeof(e -> 'payload') <> 'object')) THEN
        RAISE EXCEPTION 'each event needs a type (lowercase, not "transition") and an object payload'
            USING ERRCODE = 'LG007';
    END IF;
    WITH head AS (
        UPDATE ledger.campaign c SET event_seq = c.event_seq + v_n
         WHERE c.id = p_campaign_id AND c.generation = p_generation AND c.state = 'leased'
        RETURNING c.event_seq, c.generation, c.lease_owner
    ), written AS (
        INSERT INTO ledger.campaign_event (campaign_id, seq, type, actor, generation, delta, payload, created_at)
        SELECT p_campaign_id, head.event_seq - v_n + e.ord, e.value ->> 'type', head.lease_owner,
               head.generation, coalesce((e.value ->> 'delta')::boolean, false),
               coalesce(e.value -> 'payload', '{}'), ledger.now()
          FROM head, jsonb_array_elements(p_events) WITH ORDINALITY AS e(value, ord)
        RETURNING seq
    )
    SELECT max(seq) INTO v_last FROM written;
    IF v_last IS NULL THEN
        PERFORM ledger.raise_stale(p_campaign_id, p_generation);
    END IF;
    RETURN v_last;
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.claim_campaign(p_worker text, p_classes text[] DEFAULT NULL)
    RETURNS TABLE (campaign_id bigint, generation bigint, attempt_no integer,
                   lease_expires_at timestamptz, class text, objective_key text, target text,
                   desired_state jsonb, opening_observation jsonb, acceptance_criteria jsonb,
                   attempt_count integer, max_attempts integer)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
    v_attempt_no integer;
BEGIN
    IF p_worker IS NULL OR length(p_worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'worker identity must be 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    FOR i IN 1..3 LOOP
        BEGIN
            PERFORM ledger.begin_transition('claim', 'worker', p_worker);
            UPDATE ledger.campaign c
               SET state = 'leased',
                   generation = c.generation + 1,
                   lease_owner = p_worker,
                   leased_at = v_now,
                   lease_expires_at = v_now + make_interval(secs => (
                       SELECT cc.lease_seconds FROM ledger.campaign_class cc WHERE cc.name = c.class))
             WHERE c.id = (
                   SELECT r.id FROM ledger.campaign r
                    WHERE r.state = 'ready'
                      AND r.next_attempt_at <= v_now
                      AND (p_classes IS NULL OR r.class = ANY (p_classes))
                      AND (r.seat IS NULL OR NOT EXISTS (
                               SELECT 1 FROM ledger.campaign s
                                WHERE s.seat = r.seat AND s.state = 'leased'))
                    ORDER BY r.priority DESC, r.created_at, r.id
                    LIMIT 1
                      -- NO KEY UPDATE is all this UPDATE needs (no key column
                      -- changes), and unlike FOR UPDATE it does not conflict
                      -- with the key-share locks every journal and attempt
                      -- insert takes on its campaign through the foreign key;
                      -- FOR UPDATE would make SKIP LOCKED wait while it walks
                      -- a row's update chain.
                      FOR NO KEY UPDATE SKIP LOCKED)
            RETURNING c.* INTO v_c;
            EXIT;
        EXCEPTION WHEN unique_violation THEN
            -- another worker leased a campaign of the same seat a moment ago
            v_c := NULL;
        END;
    END LOOP;
    PERFORM ledger.end_transition();
    IF v_c.id IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO ledger.attempt (campaign_id, attempt_no, generation, worker, claimed_at, lease_expires_at)
    SELECT v_c.id, coalesce(max(a.attempt_no), 0) + 1, v_c.generation, p_worker, v_now, v_c.lease_expires_at
      FROM ledger.attempt a WHERE a.campaign_id = v_c.id
    RETURNING attempt.attempt_no INTO v_attempt_no;
    RETURN QUERY SELECT v_c.id, v_c.generation, v_attempt_no, v_c.lease_expires_at, v_c.class,
                        v_c.objective_key, v_c.target, v_c.desired_state, v_c.opening_observation,
                        v_c.acceptance_criteria, v_c.attempt_count, v_c.max_attempts;
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.claim_campaigns(p_worker text, p_classes text[] DEFAULT NULL,
                                           p_limit integer DEFAULT 10)
    RETURNS TABLE (campaign_id bigint, generation bigint, attempt_no integer,
                   lease_expires_at timestamptz, class text, objective_key text, target text,
                   desired_state jsonb, opening_observation jsonb, acceptance_criteria jsonb,
                   attempt_count integer, max_attempts integer)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_ids bigint[] := '{}';
BEGIN
    IF p_worker IS NULL OR length(p_worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'worker identity must be 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'a batch claims 1 to 1000 campaigns' USING ERRCODE = 'LG007';
    END IF;
    FOR i IN 1..3 LOOP
        BEGIN
            PERFORM ledger.begin_transition('claim', 'worker', p_worker);
            WITH picked AS (
                -- twice the batch, so campaigns that share a seat with a
                -- better one can be left out and the batch still fills
                SELECT r.id, r.seat, r.priority, r.created_at FROM ledger.campaign r
                 WHERE r.state = 'ready'
                   AND r.next_attempt_at <= v_now
                   AND (p_classes IS NULL OR r.class = ANY (p_classes))
                   AND (r.seat IS NULL OR NOT EXISTS (
                            SELECT 1 FROM ledger.campaign s
                             WHERE s.seat = r.seat AND s.state = 'leased'))
                 ORDER BY r.priority DESC, r.created_at, r.id
                 LIMIT 2 * p_limit
                   FOR NO KEY UPDATE SKIP LOCKED
            ), one_per_seat AS (
                SELECT p.id FROM (SELECT p.*, row_number() OVER (
                                      PARTITION BY coalesce(p.seat, p.id::text)
                                      ORDER BY p.priority DESC, p.created_at, p.id) AS n
                                    FROM picked p) p
                 WHERE p.n = 1
                 ORDER BY p.priority DESC, p.created_at, p.id
                 LIMIT p_limit
            ), leased AS (
                UPDATE ledger.campaign c
                   SET state = 'leased',
                       generation = c.generation + 1,
                       lease_owner = p_worker,
                       leased_at = v_now,
                       lease_expires_at = v_now + make_interval(secs => cc.lease_seconds)
                  FROM one_per_seat o, ledger.campaign_class cc
                 WHERE c.id = o.id AND cc.name = c.class
                RETURNING c.id, c.generation, c.lease_expires_at
            ), started AS (
                INSERT INTO ledger.attempt (campaign_id, attempt_no, generation, worker,
                                            claimed_at, lease_expires_at)
                SELECT l.id, coalesce((SELECT max(a.attempt_no) FROM ledger.attempt a
                                        WHERE a.campaign_id = l.id), 0) + 1,
                       l.generation, p_worker, v_now, l.lease_expires_at
                  FROM leased l
                RETURNING attempt.campaign_id
            )
            SELECT coalesce(array_agg(s.campaign_id), '{}') INTO v_ids FROM started s;
            EXIT;
        EXCEPTION WHEN unique_violation THEN
            v_ids := '{}';  -- a seat was leased by another worker a moment ago: try again
        END;
    END LOOP;
    PERFORM ledger.end_transition();
    RETURN QUERY
    SELECT c.id, c.generation, a.attempt_no, c.lease_expires_at, c.class, c.objective_key,
           c.target, c.desired_state, c.opening_observation, c.acceptance_criteria,
           c.attempt_count, c.max_attempts
      FROM ledger.campaign c
      JOIN ledger.attempt a ON a.campaign_id = c.id AND a.generation = c.generation
     WHERE c.id = ANY (v_ids)
     ORDER BY c.priority DESC, c.created_at, c.id;
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.claim_sensor_tick(p_sensor text, p_tick timestamptz, p_identity text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_rows integer;
BEGIN
    IF p_tick IS NULL OR p_tick > ledger.now() + interval '1 minute' THEN
        RAISE EXCEPTION 'a tick must be given and not in the future' USING ERRCODE = 'LG007';
    END IF;
    INSERT INTO ledger.sensor_tick (sensor, tick, claimed_by, claimed_at)
    VALUES (p_sensor, p_tick, p_identity, ledger.now())
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows = 1;
END
$$;

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

CREATE OR REPLACE FUNCTION ledger_api.claim_verification(
        p_verifier text, p_model_family text DEFAULT NULL,
        p_lease_s double precision DEFAULT 120, p_classes text[] DEFAULT NULL)
    RETURNS TABLE (verification_id bigint, campaign_id bigint, generation bigint,
                   attempt_id bigint, attempt_no integer, class text, objective_key text,
                   target text, base_sha text, candidate_sha text, fingerprint text,
                   bundle jsonb, bundle_digest text, acceptance_criteria jsonb,
                   evidence_location text, worker text, lease_expires_at timestamptz)
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
BEGIN
    IF p_verifier IS NULL OR length(p_verifier) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'verifier identity must be 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    IF p_lease_s IS NULL OR p_lease_s <= 0 THEN
        RAISE EXCEPTION 'verification lease must be positive' USING ERRCODE = 'LG007';
    END IF;
    UPDATE ledger.verification v
       SET status = 'lost', finished_at = v_now, reason = 'verifier lease expired'
     WHERE v.status = 'running' AND v.lease_expires_at < v_now;

    SELECT c.* INTO v_c
      FROM ledger.campaign c
     WHERE c.state = 'attempted'
       AND (p_classes IS NULL OR c.class = ANY (p_classes))
       AND NOT EXISTS (SELECT 1 FROM ledger.verification v
                        WHERE v.campaign_id = c.id AND v.status = 'running')
       AND NOT EXISTS (SELECT 1 FROM ledger.attempt a
                        WHERE a.campaign_id = c.id AND a.generation = c.generation
                          AND a.worker = p_verifier)
     ORDER BY c.priority DESC, c.updated_at, c.id
     LIMIT 1
       FOR UPDATE OF c SKIP LOCKED;
    IF v_c.id IS NULL THEN
        RETURN;
    END IF;
    SELECT * INTO v_a FROM ledger.attempt a
     WHERE a.campaign_id = v_c.id AND a.generation = v_c.generation;
    v_expires := v_now + make_interval(secs => p_lease_s);
    INSERT INTO ledger.verification (campaign_id, attempt_id, generation, verifier, model_family,
                                     claimed_at, lease_expires_at)
    VALUES (v_c.id, v_a.id, v_c.generation, p_verifier, p_model_family, v_now, v_expires)
    RETURNING id INTO v_id;
    PERFORM ledger.append_event(v_c.id, 'verification.started', p_verifier,
                jsonb_build_object('verification_id', v_id, 'attempt_no', v_a.attempt_no,
                                   'model_family', p_model_family));
    RETURN QUERY SELECT v_id, v_c.id, v_c.generation, v_a.id, v_a.attempt_no, v_c.class,
                        v_c.objective_key, v_c.target, v_a.base_sha, v_a.candidate_sha,
                        v_a.fingerprint, v_a.bundle, v_a.bundle_digest, v_c.acceptance_criteria,
                        v_c.evidence_location, v_a.worker, v_expires;
END
$$;

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

CREATE OR REPLACE FUNCTION ledger_api.expire_leases(p_grace_s double precision DEFAULT 0,
                                         p_limit integer DEFAULT 100)
    RETURNS TABLE (campaign_id bigint, generation bigint, worker text, state text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_cutoff timestamptz := ledger.now() - make_interval(secs => greatest(p_grace_s, 0));
    v_ids bigint[];
    v_id bigint;
BEGIN
    PERFORM ledger.begin_transition('expire_lease', 'reaper', 'reaper',
                jsonb_build_object('reason', 'lease expired', 'grace_s', p_grace_s));
    WITH reaped AS (
        UPDATE ledger.campaign c
           SET state = 'ready', generation = c.generation + 1,
               lease_owner = NULL, leased_at = NULL, lease_expires_at = NULL,
               attempt_count = c.attempt_count + 1, next_attempt_at = v_now,
               last_failure_reason = 'lease expired: the worker was lost'
         WHERE c.id = ANY (ARRAY(
                   SELECT e.id FROM ledger.campaign e
                    WHERE e.state = 'leased' AND e.lease_expires_at < v_cutoff
                    ORDER BY e.lease_expires_at
                    LIMIT greatest(p_limit, 1)))
           AND c.state = 'leased'
           AND c.lease_expires_at < v_cutoff
        RETURNING c.id
    )
    SELECT array_agg(r.id) INTO v_ids FROM reaped r;
    PERFORM ledger.end_transition();
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    UPDATE ledger.attempt a
       SET outcome = 'lost', ended_at = v_now, failure_reason = 'lease expired'
     WHERE a.campaign_id = ANY (v_ids) AND a.outcome = 'running';
    FOREACH v_id IN ARRAY v_ids LOOP
        PERFORM ledger.exhaust_if_spent(v_id);
    END LOOP;
    RETURN QUERY
        SELECT c.id, c.generation, a.worker, c.state
          FROM ledger.campaign c
          JOIN ledger.attempt a ON a.campaign_id = c.id AND a.generation = c.generation - 1
         WHERE c.id = ANY (v_ids);
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.fail_attempt(
        p_campaign_id bigint, p_generation bigint, p_reason text,
        p_fingerprint text DEFAULT NULL, p_retry_after_s double precision DEFAULT NULL,
        p_drained boolean DEFAULT false)
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
    v_count integer;
    v_next timestamptz;
    v_attempt_no integer;
BEGIN
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id FOR UPDATE;
    IF NOT FOUND OR v_c.generation <> p_generation OR v_c.state <> 'leased' THEN
        PERFORM ledger.raise_stale(p_campaign_id, p_generation);
    END IF;
    IF p_reason IS NULL OR p_reason = '' THEN
        RAISE EXCEPTION 'a failed attempt needs a reason' USING ERRCODE = 'LG007';
    END IF;
    IF p_retry_after_s < 0 THEN
        RAISE EXCEPTION 'retry_after must not be negative' USING ERRCODE = 'LG007';
    END IF;
    v_count := v_c.attempt_count + CASE WHEN p_drained THEN 0 ELSE 1 END;
    v_next := CASE WHEN p_drained THEN v_now
                   ELSE v_now + coalesce(make_interval(secs => p_retry_after_s),
                                         ledger.backoff(v_c.class, v_count)) END;
    UPDATE ledger.attempt a
       SET outcome = CASE WHEN p_drained THEN 'drained' ELSE 'failed' END,
           ended_at = v_now, failure_reason = left(p_reason, 4000), fingerprint = p_fingerprint
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation
    RETURNING a.attempt_no INTO v_attempt_no;
    PERFORM ledger.begin_transition('fail_attempt', 'worker', v_c.lease_owner,
                jsonb_build_object('attempt_no', v_attempt_no, 'reason', left(p_reason, 4000),
                                   'drained', p_drained, 'next_attempt_at', v_next,
                                   'fingerprint', p_fingerprint));
    UPDATE ledger.campaign c
       SET state = 'ready', lease_owner = NULL, leased_at = NULL, lease_expires_at = NULL,
           attempt_count = v_count, next_attempt_at = v_next,
           last_failure_reason = left(p_reason, 4000)
     WHERE c.id = p_campaign_id;
    PERFORM ledger.end_transition();
    IF ledger.exhaust_if_spent(p_campaign_id) THEN
        RETURN 'exhausted';
    END IF;
    RETURN 'ready';
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.heartbeat(p_campaign_id bigint, p_generation bigint)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_expires timestamptz;
BEGIN
    UPDATE ledger.campaign c
       SET lease_expires_at = v_now + make_interval(secs => cc.lease_seconds)
      FROM ledger.campaign_class cc
     WHERE c.id = p_campaign_id AND c.generation = p_generation AND c.state = 'leased'
       AND cc.name = c.class
    RETURNING c.lease_expires_at INTO v_expires;
    IF NOT FOUND THEN
        PERFORM ledger.raise_stale(p_campaign_id, p_generation);
    END IF;
    UPDATE ledger.attempt a
       SET last_heartbeat_at = v_now, heartbeat_count = a.heartbeat_count + 1,
           lease_expires_at = v_expires
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
    RETURN v_expires;
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.heartbeat_verification(p_verification_id bigint,
                                                  p_lease_s double precision DEFAULT 120)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_expires timestamptz;
BEGIN
    UPDATE ledger.verification v
       SET lease_expires_at = ledger.now() + make_interval(secs => p_lease_s)
      FROM ledger.campaign c
     WHERE v.id = p_verification_id AND v.status = 'running'
       AND c.id = v.campaign_id AND c.generation = v.generation AND c.state = 'attempted'
    RETURNING v.lease_expires_at INTO v_expires;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'verification % is no longer current', p_verification_id
            USING ERRCODE = 'LG001';
    END IF;
    RETURN v_expires;
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.open_campaign(
        p_class text, p_objective_key text, p_target text,
        p_desired_state jsonb DEFAULT '{}', p_observation jsonb DEFAULT '{}',
        p_priority integer DEFAULT 0, p_seat text DEFAULT NULL, p_labels text[] DEFAULT '{}',
        p_acceptance jsonb DEFAULT NULL, p_sensor text DEFAULT NULL)
    RETURNS TABLE (campaign_id bigint, created boolean, state text, generation bigint)
    LANGUAGE sql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM ledger.open_campaign(p_class, p_objective_key, p_target, p_desired_state,
                                       p_observation, p_priority, p_seat, p_labels,
                                       p_acceptance, coalesce(p_sensor, 'sensor'))
$$;

CREATE OR REPLACE FUNCTION ledger_api.record_attempt(
        p_campaign_id bigint, p_generation bigint, p_base_sha text, p_candidate_sha text,
        p_fingerprint text, p_bundle jsonb DEFAULT NULL, p_bundle_digest text DEFAULT NULL,
        p_evidence_location text DEFAULT NULL, p_log_tail text DEFAULT NULL)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
    v_attempt_no integer;
BEGIN
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id FOR UPDATE;
    IF NOT FOUND OR v_c.generation <> p_generation OR v_c.state <> 'leased' THEN
        PERFORM ledger.raise_stale(p_campaign_id, p_generation);
    END IF;
    IF p_fingerprint IS NULL OR p_fingerprint !~ '^[A-Za-z0-9:_.-]{8,200}$' THEN
        RAISE EXCEPTION 'an attempt needs a fingerprint (8-200 characters of [A-Za-z0-9:_.-])'
            USING ERRCODE = 'LG007';
    END IF;
    IF p_candidate_sha IS NULL OR p_candidate_sha !~ '^[0-9a-f]{7,64}$'
       OR (p_base_sha IS NOT NULL AND p_base_sha !~ '^[0-9a-f]{7,64}$') THEN
        RAISE EXCEPTION 'candidate and base must be hexadecimal commit ids' USING ERRCODE = 'LG007';
    END IF;
    IF EXISTS (SELECT 1 FROM ledger.attempt a
                WHERE a.campaign_id = p_campaign_id AND a.fingerprint = p_fingerprint
                  AND (a.outcome = 'failed' OR a.verdict = 'rejected')) THEN
        RAISE EXCEPTION 'the next attempt must differ: approach % already failed on campaign %',
            p_fingerprint, p_campaign_id USING ERRCODE = 'LG006';
    END IF;
    UPDATE ledger.attempt a
       SET outcome = 'attempted', ended_at = v_now, fingerprint = p_fingerprint,
           base_sha = p_base_sha, candidate_sha = p_candidate_sha, bundle = p_bundle,
           bundle_digest = p_bundle_digest, log_tail = p_log_tail
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation
    RETURNING a.attempt_no INTO v_attempt_no;
    -- (The journal trigger describes the attempt from its row.)
    PERFORM ledger.begin_transition('record_attempt', 'worker', v_c.lease_owner);
    UPDATE ledger.campaign c
       SET state = 'attempted', lease_owner = NULL, leased_at = NULL, lease_expires_at = NULL,
           attempt_count = c.attempt_count + 1,
           evidence_location = coalesce(p_evidence_location, c.evidence_location),
           last_failure_reason = NULL
     WHERE c.id = p_campaign_id;
    PERFORM ledger.end_transition();
    RETURN v_attempt_no;
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.record_attempts(p_attempts jsonb)
    RETURNS TABLE (campaign_id bigint, generation bigint, status text, attempt_no integer)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_ids bigint[];
BEGIN
    IF p_attempts IS NULL OR jsonb_typeof(p_attempts) <> 'array'
       OR jsonb_array_length(p_attempts) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'record_attempts takes a JSON array of 1 to 1000 attempts' USING ERRCODE = 'LG007';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_attempts) AS i(fingerprint text)
                WHERE coalesce(i.fingerprint, '') !~ '^[A-Za-z0-9:_.-]{8,200}$') THEN
        RAISE EXCEPTION 'an attempt needs a fingerprint (8-200 characters of [A-Za-z0-9:_.-])'
            USING ERRCODE = 'LG007';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_attempts)
                             AS i(campaign_id bigint, generation bigint, candidate_sha text, base_sha text)
                WHERE coalesce(i.candidate_sha, '') !~ '^[0-9a-f]{7,64}$' OR i.base_sha !~ '^[0-9a-f]{7,64}$'
                   OR i.campaign_id IS NULL OR i.generation IS NULL) THEN
        RAISE EXCEPTION 'each attempt needs campaign_id, generation and hexadecimal commit ids'
            USING ERRCODE = 'LG007';
    END IF;
    -- Lock the live leases, in id order as every writer of several campaigns does.
    SELECT coalesce(array_agg(l.id), '{}') INTO v_ids
      FROM (SELECT c.id FROM ledger.campaign c
              JOIN jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, generation bigint)
                ON i.campaign_id = c.id AND i.generation = c.generation
             WHERE c.state = 'leased'
             ORDER BY c.id FOR NO KEY UPDATE OF c) l;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, fingerprint text)
                 JOIN ledger.attempt a ON a.campaign_id = i.campaign_id AND a.fingerprint = i.fingerprint
                WHERE i.campaign_id = ANY (v_ids) AND (a.outcome = 'failed' OR a.verdict = 'rejected')) THEN
        RAISE EXCEPTION 'the next attempt must differ: an approach in this batch already failed on its campaign'
            USING ERRCODE = 'LG006';
    END IF;
    UPDATE ledger.attempt a
       SET outcome = 'attempted', ended_at = v_now, fingerprint = i.fingerprint,
           base_sha = i.base_sha, candidate_sha = i.candidate_sha, bundle = i.bundle,
           bundle_digest = i.bundle_digest, log_tail = i.log_tail
      FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, generation bigint, candidate_sha text,
               fingerprint text, base_sha text, bundle jsonb, bundle_digest text, log_tail text)
     WHERE i.campaign_id = ANY (v_ids) AND a.campaign_id = i.campaign_id AND a.generation = i.generation;
    -- One UPDATE for the batch: the journal trigger reads each event's
    -- details and lease holder from that campaign's own rows.
    PERFORM ledger.begin_transition('record_attempt', 'worker', NULL);
    UPDATE ledger.campaign c
       SET state = 'attempted', lease_owner = NULL, leased_at = NULL, lease_expires_at = NULL,
           attempt_count = c.attempt_count + 1,
           evidence_location = coalesce(i.evidence_location, c.evidence_location),
           last_failure_reason = NULL
      FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, evidence_location text)
     WHERE c.id = i.campaign_id AND c.id = ANY (v_ids);
    PERFORM ledger.end_transition();
    RETURN QUERY
    SELECT i.campaign_id, i.generation,
           CASE WHEN i.campaign_id = ANY (v_ids) THEN 'recorded' ELSE 'stale' END,
           CASE WHEN i.campaign_id = ANY (v_ids) THEN a.attempt_no END
      FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, generation bigint)
      LEFT JOIN ledger.attempt a ON a.campaign_id = i.campaign_id AND a.generation = i.generation
     ORDER BY i.campaign_id;
END
$$;

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

CREATE OR REPLACE FUNCTION ledger_api.register_class(
        p_name text, p_max_attempts integer DEFAULT 3, p_lease_seconds double precision DEFAULT 60,
        p_backoff_base_s double precision DEFAULT 5, p_backoff_factor double precision DEFAULT 2,
        p_backoff_cap_s double precision DEFAULT 600, p_backoff_jitter double precision DEFAULT 0.1,
        p_seat_policy text DEFAULT 'none', p_authority jsonb DEFAULT '{}',
        p_acceptance jsonb DEFAULT '{}', p_promotion jsonb DEFAULT '{}',
        p_verifier text DEFAULT 'command')
    RETURNS void
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
BEGIN
    INSERT INTO ledger.campaign_class AS cc
           (name, max_attempts, lease_seconds, backoff_base_s, backoff_factor, backoff_cap_s,
            backoff_jitter, seat_policy, authority, acceptance, promotion, verifier,
            created_at, updated_at)
    VALUES (p_name, p_max_attempts, p_lease_seconds, p_backoff_base_s, p_backoff_factor,
            p_backoff_cap_s, p_backoff_jitter, p_seat_policy, coalesce(p_authority, '{}'),
            coalesce(p_acceptance, '{}'), coalesce(p_promotion, '{}'), p_verifier, v_now, v_now)
    ON CONFLICT (name) DO UPDATE
       SET max_attempts = excluded.max_attempts, lease_seconds = excluded.lease_seconds,
           backoff_base_s = excluded.backoff_base_s, backoff_factor = excluded.backoff_factor,
           backoff_cap_s = excluded.backoff_cap_s, backoff_jitter = excluded.backoff_jitter,
           seat_policy = excluded.seat_policy, authority = excluded.authority,
           acceptance = excluded.acceptance, promotion = excluded.promotion,
           verifier = excluded.verifier, updated_at = v_now;
END
$$;

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
    v_v := ledger.current_verification(p_verification_id);
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

CREATE OR REPLACE FUNCTION ledger_api.reopen(p_campaign_id bigint, p_operator text DEFAULT NULL,
                                  p_extra_attempts integer DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_c ledger.campaign;
    v_extra integer;
BEGIN
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign % does not exist', p_campaign_id USING ERRCODE = 'LG004';
    END IF;
    IF v_c.state <> 'exhausted' THEN
        RAISE EXCEPTION 'illegal transition reopen of campaign %: it is %, not exhausted',
            p_campaign_id, v_c.state USING ERRCODE = 'LG002';
    END IF;
    IF p_extra_attempts IS NOT NULL AND p_extra_attempts < 1 THEN
        RAISE EXCEPTION 'extra attempts must be at least 1' USING ERRCODE = 'LG007';
    END IF;
    SELECT coalesce(p_extra_attempts, cc.max_attempts) INTO v_extra
      FROM ledger.campaign_class cc WHERE cc.name = v_c.class;
    PERFORM ledger.begin_transition('reopen', 'operator', coalesce(p_operator, 'operator'),
                jsonb_build_object('extra_attempts', v_extra));
    UPDATE ledger.campaign c
       SET state = 'ready', max_attempts = c.attempt_count + v_extra, next_attempt_at = ledger.now()
     WHERE c.id = p_campaign_id;
    PERFORM ledger.end_transition();
    RETURN v_c.generation;
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.request_side_effect(
        p_campaign_id bigint, p_generation bigint, p_kind text, p_target text,
        p_precondition jsonb, p_idempotency_key text, p_payload jsonb DEFAULT '{}')
    RETURNS TABLE (side_effect_id bigint, status text, state text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
    v_authority jsonb;
    v_existing ledger.side_effect;
    v_id bigint;
BEGIN
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id FOR UPDATE;
    IF NOT FOUND OR v_c.generation <> p_generation OR v_c.state <> 'leased' THEN
        PERFORM ledger.raise_stale(p_campaign_id, p_generation);
    END IF;
    IF p_kind IS NULL OR p_kind NOT IN ('git.update_ref', 'http.request') THEN
        RAISE EXCEPTION 'unknown side effect kind %', p_kind USING ERRCODE = 'LG007';
    END IF;
    IF coalesce(p_idempotency_key, '') = '' OR coalesce(p_target, '') = '' THEN
        RAISE EXCEPTION 'a side effect needs a target and an idempotency key' USING ERRCODE = 'LG007';
    END IF;
    SELECT cc.authority INTO v_authority FROM ledger.campaign_class cc WHERE cc.name = v_c.class;
    -- Every place the effect would touch must be inside the profile: the
    -- target, and for HTTP also each URL the payload names (the request and
    -- its read-back), or an allowed target could smuggle another host.
    IF NOT ledger.authorized(v_authority, 'worker', p_kind, p_target)
       OR (p_kind = 'http.request' AND EXISTS (
               SELECT 1 FROM unnest(ARRAY[p_payload ->> 'url', p_payload -> 'read_back' ->> 'url']) AS u(url)
                WHERE u.url IS NOT NULL
                  AND NOT ledger.authorized(v_authority, 'worker', p_kind, u.url))) THEN
        INSERT INTO ledger.security_event (at, actor_role, actor, campaign_id, action, target, reason, details)
        VALUES (v_now, 'worker', v_c.lease_owner, p_campaign_id, p_kind, p_target,
                format('outside the worker authority profile of class %s', v_c.class),
                jsonb_build_object('generation', p_generation, 'precondition', p_precondition,
                                   'payload', p_payload, 'idempotency_key', p_idempotency_key));
        PERFORM ledger.append_event(p_campaign_id, 'security.refused', v_c.lease_owner,
                    jsonb_build_object('kind', p_kind, 'target', p_target));
        RETURN QUERY SELECT NULL::bigint, 'forbidden'::text, NULL::text;
        RETURN;
    END IF;
    SELECT * INTO v_existing FROM ledger.side_effect s WHERE s.idempotency_key = p_idempotency_key;
    IF FOUND THEN
        RETURN QUERY SELECT v_existing.id, 'existing'::text, v_existing.state;
        RETURN;
    END IF;
    INSERT INTO ledger.side_effect (campaign_id, generation, kind, purpose, target, precondition,
                                    payload, idempotency_key, requested_by, requested_role,
                                    next_try_at, created_at, updated_at)
    VALUES (p_campaign_id, p_generation, p_kind, 'other', p_target, coalesce(p_precondition, '{}'),
            coalesce(p_payload, '{}'), p_idempotency_key, v_c.lease_owner, 'worker',
            v_now, v_now, v_now)
    RETURNING id INTO v_id;
    PERFORM ledger.append_event(p_campaign_id, 'side_effect.requested', v_c.lease_owner,
                jsonb_build_object('side_effect_id', v_id, 'kind', p_kind, 'target', p_target));
    PERFORM pg_notify('ledger_outbox', v_id::text);
    RETURN QUERY SELECT v_id, 'requested'::text, 'pending'::text;
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.trim_journal(p_older_than_s double precision)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_deleted bigint;
BEGIN
    IF p_older_than_s IS NULL OR p_older_than_s < 0 THEN
        RAISE EXCEPTION 'older_than must not be negative' USING ERRCODE = 'LG007';
    END IF;
    PERFORM set_config('ledger.retention', 'on', true);
    DELETE FROM ledger.campaign_event e
     USING ledger.campaign c
     WHERE e.campaign_id = c.id AND e.delta
       AND c.closed_at < ledger.now() - make_interval(secs => p_older_than_s);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    PERFORM set_config('ledger.retention', 'off', true);
    RETURN v_deleted;
END
$$;


DROP FUNCTION IF EXISTS ledger.fence(bigint, bigint);
DROP FUNCTION IF EXISTS ledger.check_live(ledger.campaign, bigint);
DROP FUNCTION IF EXISTS ledger.lease_row(bigint, bigint);
DROP FUNCTION IF EXISTS ledger.check_lease_args(bigint, bigint);
DROP FUNCTION IF EXISTS ledger.check_range(text, double precision, double precision, double precision, boolean);
DROP FUNCTION IF EXISTS ledger.generation_live(ledger.campaign, bigint);
DROP FUNCTION IF EXISTS ledger.ended_as(bigint, bigint, text);

ALTER TABLE ledger.campaign DROP COLUMN IF EXISTS last_append_key, DROP COLUMN IF EXISTS last_append_seq;

DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT p.oid::regprocedure AS fn, x.actor
          FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace AND n.nspname = 'ledger_api'
          JOIN (VALUES ('open_campaign', 'sensor'), ('record_observation', 'sensor'),
                       ('claim_campaign', 'worker'), ('claim_campaigns', 'worker'), ('heartbeat', 'worker'),
                       ('append_events', 'worker'), ('claim_verification', 'verifier'),
                       ('heartbeat_verification', 'verifier'), ('accept', 'verifier'), ('reject', 'verifier'),
                       ('claim_side_effect', 'dispatcher'))
               AS x(fn, actor) ON x.fn = p.proname
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', g.fn);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', g.fn, ledger.role_name(g.actor));
    END LOOP;
END
$$;
