-- 0008 the fence holds against every writer
--
-- * Liveness inside every lease-holder write: a holder whose lease_expires_at
--   has passed is stale at once, reaped or not (the reaper only tidies up).
--   The same for a verifier's and a dispatcher's own claims.
-- * A NULL id or generation is refused (LG007), never compared: `x <> NULL`
--   is NULL, and a NULL fence passed.
-- * Intents die with their generation: when a generation's attempt is over
--   without success (failed, rejected, reaped, abandoned, promotion failed,
--   regressed) its pending intents are cancelled in the same transaction (the
--   journal trigger does it, so every writer meets it); claim_side_effect
--   skips intents whose generation is no longer live, and a dispatcher
--   confirms just before it acts (confirm_side_effect).
-- * Endings are idempotent: retrying the identical ending of a generation
--   returns its first result; a different one is still refused.
-- * Intake refuses a different request for an open objective (LG011).
-- * Every numeric argument has a finite range, checked in SQL.
-- * Claims and renewals say how long the lease is, by the database's clock,
--   so a holder can fence itself by its own clock (ledger.lease).

------------------------------------------------------------------------------
-- Argument checks, written once
------------------------------------------------------------------------------

-- A numeric argument within [p_min, p_max]; NaN and the infinities are out
-- of every range (NaN compares greater than every number in PostgreSQL).
CREATE FUNCTION ledger.check_range(p_name text, p_value double precision,
                                   p_min double precision, p_max double precision,
                                   p_nullable boolean DEFAULT false)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_value IS NULL THEN
        IF p_nullable THEN
            RETURN;
        END IF;
        RAISE EXCEPTION '% is required', p_name USING ERRCODE = 'LG007';
    END IF;
    IF NOT (p_value BETWEEN p_min AND p_max) THEN
        RAISE EXCEPTION '% must be a finite number from % to %, not %', p_name, p_min, p_max, p_value
            USING ERRCODE = 'LG007';
    END IF;
END
$$;

-- The identity of a lease: both parts given.
CREATE FUNCTION ledger.check_lease_args(p_campaign_id bigint, p_generation bigint)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_campaign_id IS NULL OR p_generation IS NULL THEN
        RAISE EXCEPTION 'a lease holder''s write needs its campaign id and generation (got %, %)',
            coalesce(p_campaign_id::text, 'null'), coalesce(p_generation::text, 'null')
            USING ERRCODE = 'LG007';
    END IF;
END
$$;

------------------------------------------------------------------------------
-- The fence
------------------------------------------------------------------------------

-- The campaign a lease names, locked. Callers with an idempotent ending look
-- at what the lease already wrote (after the lock, so a first try that
-- committed meanwhile is seen) before they test it with ledger.check_live.
CREATE FUNCTION ledger.lease_row(p_campaign_id bigint, p_generation bigint)
    RETURNS ledger.campaign
    LANGUAGE plpgsql
AS $$
DECLARE
    v_c ledger.campaign;
BEGIN
    PERFORM ledger.check_lease_args(p_campaign_id, p_generation);
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign % does not exist', p_campaign_id USING ERRCODE = 'LG004';
    END IF;
    RETURN v_c;
END
$$;

-- Refuse unless generation p_generation holds the live lease of campaign
-- p_c now: the right generation, leased, and not expired by the database's
-- clock -- whether or not a reaper has run.
CREATE FUNCTION ledger.check_live(p_c ledger.campaign, p_generation bigint)
    RETURNS void
    LANGUAGE plpgsql
AS $$
BEGIN
    IF p_c.generation <> p_generation OR p_c.state <> 'leased' THEN
        RAISE EXCEPTION 'stale lease on campaign %: generation % is not current (generation %, state %)',
            p_c.id, p_generation, p_c.generation, p_c.state
            USING ERRCODE = 'LG001',
                  DETAIL = json_build_object('generation', p_c.generation, 'state', p_c.state)::text;
    END IF;
    IF p_c.lease_expires_at <= ledger.now() THEN
        RAISE EXCEPTION 'stale lease on campaign %: generation % expired at % (not yet reaped)',
            p_c.id, p_generation, p_c.lease_expires_at
            USING ERRCODE = 'LG001',
                  DETAIL = json_build_object('generation', p_c.generation, 'state', p_c.state,
                                             'expired', true)::text;
    END IF;
END
$$;

-- Both of the above: the campaign, locked, if p_generation's lease is live.
CREATE FUNCTION ledger.fence(p_campaign_id bigint, p_generation bigint)
    RETURNS ledger.campaign
    LANGUAGE plpgsql
AS $$
DECLARE
    v_c ledger.campaign := ledger.lease_row(p_campaign_id, p_generation);
BEGIN
    PERFORM ledger.check_live(v_c, p_generation);
    RETURN v_c;
END
$$;

-- For the one-statement writers (heartbeat, append_events) whose UPDATE
-- matched nothing: say why.
CREATE OR REPLACE FUNCTION ledger.raise_stale(p_campaign_id bigint, p_generation bigint) RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_c ledger.campaign;
BEGIN
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign % does not exist', p_campaign_id USING ERRCODE = 'LG004';
    END IF;
    PERFORM ledger.check_live(v_c, p_generation);
    -- live again by now (cannot happen: a lease is only renewed by its holder)
    RAISE EXCEPTION 'stale lease on campaign %: generation % was not live at the write',
        p_campaign_id, p_generation USING ERRCODE = 'LG001';
END
$$;

-- Which intents of generation p_generation may still be carried out: those
-- whose attempt is still in play or succeeded.
CREATE FUNCTION ledger.generation_live(p_c ledger.campaign, p_generation bigint)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE
AS $$
    SELECT p_c.generation = p_generation
       AND p_c.state IN ('leased', 'attempted', 'verified', 'confirmed')
$$;

-- The state an ending of generation p_generation left its campaign in,
-- from the journal: the transition's `to`, or exhausted if the next event
-- exhausted it. (For an identical retry of that ending.)
CREATE FUNCTION ledger.ended_as(p_campaign_id bigint, p_generation bigint, p_transition text)
    RETURNS text
    LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN n.payload ->> 'transition' = 'exhaust' THEN 'exhausted'
                ELSE e.payload ->> 'to' END
      FROM ledger.campaign_event e
      LEFT JOIN ledger.campaign_event n
             ON n.campaign_id = e.campaign_id AND n.seq = e.seq + 1 AND n.type = 'transition'
     WHERE e.campaign_id = p_campaign_id AND e.type = 'transition'
       AND e.generation = p_generation AND e.payload ->> 'transition' = p_transition
     ORDER BY e.seq DESC
     LIMIT 1
$$;

------------------------------------------------------------------------------
-- Intents die with their generation (in the journal trigger: every writer)
------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION ledger.campaign_journal() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    v_from text := CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END;
    v_name text := current_setting('ledger.transition', true);
    v_detail jsonb := coalesce(nullif(current_setting('ledger.detail', true), '')::jsonb, '{}');
    v_actor text := coalesce(nullif(current_setting('ledger.actor', true), ''), 'system');
    v_cancelled bigint[];
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
    -- A generation whose attempt is over without success, or that is
    -- superseded (a rebase), or a campaign abandoned, takes its pending
    -- intents with it: nothing a lost lease asked for is carried out later. Claimed intents are mid-dispatch; their
    -- dispatcher confirms the generation just before acting.
    IF v_from IN ('leased', 'attempted', 'verified') AND NEW.state NOT IN ('attempted', 'verified', 'confirmed')
       OR NEW.state = 'abandoned'
       OR (v_from IN ('attempted', 'verified') AND NEW.generation > OLD.generation) THEN
        WITH cancelled AS (
            UPDATE ledger.side_effect s
               SET state = 'cancelled', finished_at = ledger.now(), updated_at = ledger.now(),
                   error = format('generation %s of the campaign ended (%s)', s.generation,
                                  coalesce(v_name, NEW.state))
             WHERE s.campaign_id = NEW.id AND s.state = 'pending' AND s.generation <= OLD.generation
            RETURNING s.id
        )
        SELECT array_agg(c.id ORDER BY c.id) INTO v_cancelled FROM cancelled c;
        IF v_cancelled IS NOT NULL THEN
            v_detail := v_detail || jsonb_build_object('cancelled_intents', to_jsonb(v_cancelled));
        END IF;
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

------------------------------------------------------------------------------
-- Columns
------------------------------------------------------------------------------

-- The key of the last journal batch a holder appended, and that batch's last
-- seq: a retried batch (its reply was lost) returns the seq instead of
-- appending twice. Written by the UPDATE that takes the seqs anyway.
ALTER TABLE ledger.campaign
    ADD COLUMN last_append_key text,
    ADD COLUMN last_append_seq bigint;

-- Class settings: finite and bounded (NaN passed `lease_seconds > 0`).
ALTER TABLE ledger.campaign_class
    DROP CONSTRAINT campaign_class_lease_seconds_check,
    DROP CONSTRAINT campaign_class_backoff_base_s_check,
    DROP CONSTRAINT campaign_class_backoff_factor_check,
    DROP CONSTRAINT campaign_class_backoff_cap_s_check,
    DROP CONSTRAINT campaign_class_backoff_jitter_check,
    ADD CONSTRAINT campaign_class_lease_seconds_check CHECK (lease_seconds > 0 AND lease_seconds <= 604800),
    ADD CONSTRAINT campaign_class_backoff_base_s_check CHECK (backoff_base_s BETWEEN 0 AND 604800),
    ADD CONSTRAINT campaign_class_backoff_factor_check CHECK (backoff_factor BETWEEN 1 AND 1000),
    ADD CONSTRAINT campaign_class_backoff_cap_s_check CHECK (backoff_cap_s BETWEEN 0 AND 604800),
    ADD CONSTRAINT campaign_class_backoff_jitter_check CHECK (backoff_jitter BETWEEN 0 AND 1);

------------------------------------------------------------------------------
-- Intake
------------------------------------------------------------------------------

DROP FUNCTION IF EXISTS ledger.open_campaign(text, text, text, jsonb, jsonb, integer, text, text[], jsonb, text);
-- Opens a campaign unless one is open for the objective (shared by
-- open_campaign and record_observation). With p_strict, an open campaign
-- whose request differs (desired state, priority, labels, seat, acceptance)
-- is refused with LG011 naming the fields, instead of being returned as if
-- the request had been taken.
CREATE FUNCTION ledger.open_campaign(
        p_class text, p_objective_key text, p_target text, p_desired_state jsonb,
        p_observation jsonb, p_priority integer, p_seat text, p_labels text[],
        p_acceptance jsonb, p_sensor text, p_strict boolean)
    RETURNS TABLE (campaign_id bigint, created boolean, state text, generation bigint)
    LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_class ledger.campaign_class;
    v_id bigint;
    v_existing ledger.campaign;
    v_seat text;
    v_acceptance jsonb;
    v_labels text[];
    v_differs jsonb;
BEGIN
    SELECT * INTO v_class FROM ledger.campaign_class cc WHERE cc.name = p_class;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign class % is not registered (run: ledger classes sync)', p_class
            USING ERRCODE = 'LG004';
    END IF;
    PERFORM ledger.check_range('priority', coalesce(p_priority, 0), -1000000, 1000000);
    v_seat := coalesce(p_seat, CASE v_class.seat_policy WHEN 'target' THEN p_target END);
    v_acceptance := coalesce(p_acceptance, v_class.acceptance);
    v_labels := coalesce(p_labels, '{}');
    FOR i IN 1..3 LOOP
        PERFORM ledger.begin_transition('open', 'sensor', p_sensor,
                                        jsonb_build_object('observation', coalesce(p_observation, '{}')));
        INSERT INTO ledger.campaign AS c
               (class, objective_key, target, desired_state, opening_observation, state,
                max_attempts, next_attempt_at, acceptance_criteria, seat, priority, labels,
                created_at, updated_at)
        VALUES (p_class, p_objective_key, p_target, coalesce(p_desired_state, '{}'),
                coalesce(p_observation, '{}'), 'ready', v_class.max_attempts, ledger.now(),
                v_acceptance, v_seat, coalesce(p_priority, 0), v_labels, ledger.now(), ledger.now())
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
            IF p_strict THEN
                SELECT coalesce(jsonb_object_agg(d.field, jsonb_build_object('open', d.open, 'requested', d.requested)), '{}')
                  INTO v_differs
                  FROM (VALUES
                        ('desired_state', v_existing.desired_state, coalesce(p_desired_state, '{}')),
                        ('priority', to_jsonb(v_existing.priority), to_jsonb(coalesce(p_priority, 0))),
                        ('labels', to_jsonb(ARRAY(SELECT DISTINCT l FROM unnest(v_existing.labels) l ORDER BY l)),
                                   to_jsonb(ARRAY(SELECT DISTINCT l FROM unnest(v_labels) l ORDER BY l))),
                        ('seat', to_jsonb(v_existing.seat), to_jsonb(v_seat)),
                        ('acceptance', v_existing.acceptance_criteria, v_acceptance)
                       ) AS d(field, open, requested)
                 WHERE d.open IS DISTINCT FROM d.requested;
                IF v_differs <> '{}' THEN
                    RAISE EXCEPTION 'objective % is already open as campaign % with a different %',
                        p_objective_key, v_existing.id,
                        (SELECT string_agg(k, ', ' ORDER BY k) FROM jsonb_object_keys(v_differs) k)
                        USING ERRCODE = 'LG011',
                              DETAIL = jsonb_build_object('campaign_id', v_existing.id,
                                                          'differs', v_differs)::text;
                END IF;
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
                                       p_acceptance, coalesce(p_sensor, 'sensor'), true)
$$;
COMMENT ON FUNCTION ledger_api.open_campaign IS
    'Open a campaign for an objective; the identical request returns the open one, a different one is refused (LG011).';

-- (unchanged but for the open: a campaign opened meanwhile by another sensor is no conflict)
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
                                        0, NULL, p_labels, NULL, p_sensor, false) o;
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

------------------------------------------------------------------------------
-- Workers
------------------------------------------------------------------------------

-- Claims now also say how long the lease is (by the database's clock), for
-- the holder's own clock (ledger.lease). Otherwise as in 0007.
DROP FUNCTION IF EXISTS ledger_api.claim_campaign(text, text[]);
CREATE FUNCTION ledger_api.claim_campaign(p_worker text, p_classes text[] DEFAULT NULL)
    RETURNS TABLE (campaign_id bigint, generation bigint, attempt_no integer,
                   lease_expires_at timestamptz, class text, objective_key text, target text,
                   desired_state jsonb, opening_observation jsonb, acceptance_criteria jsonb,
                   attempt_count integer, max_attempts integer, lease_remaining_s double precision)
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
                        v_c.acceptance_criteria, v_c.attempt_count, v_c.max_attempts,
                        extract(epoch FROM v_c.lease_expires_at - v_now)::double precision;
END
$$;

DROP FUNCTION IF EXISTS ledger_api.claim_campaigns(text, text[], integer);
CREATE FUNCTION ledger_api.claim_campaigns(p_worker text, p_classes text[] DEFAULT NULL,
                                           p_limit integer DEFAULT 10)
    RETURNS TABLE (campaign_id bigint, generation bigint, attempt_no integer,
                   lease_expires_at timestamptz, class text, objective_key text, target text,
                   desired_state jsonb, opening_observation jsonb, acceptance_criteria jsonb,
                   attempt_count integer, max_attempts integer, lease_remaining_s double precision)
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
           c.attempt_count, c.max_attempts,
           extract(epoch FROM c.lease_expires_at - v_now)::double precision
      FROM ledger.campaign c
      JOIN ledger.attempt a ON a.campaign_id = c.id AND a.generation = c.generation
     WHERE c.id = ANY (v_ids)
     ORDER BY c.priority DESC, c.created_at, c.id;
END
$$;

-- Roll the lease forward, if it is still live: a heartbeat at or after the
-- expiry loses, reaped or not. Returns the new expiry and the lease length.
DROP FUNCTION IF EXISTS ledger_api.heartbeat(bigint, bigint);
CREATE FUNCTION ledger_api.heartbeat(p_campaign_id bigint, p_generation bigint)
    RETURNS TABLE (lease_expires_at timestamptz, lease_remaining_s double precision)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_expires timestamptz;
    v_lease double precision;
BEGIN
    PERFORM ledger.check_lease_args(p_campaign_id, p_generation);
    UPDATE ledger.campaign c
       SET lease_expires_at = v_now + make_interval(secs => cc.lease_seconds)
      FROM ledger.campaign_class cc
     WHERE c.id = p_campaign_id AND c.generation = p_generation AND c.state = 'leased'
       AND c.lease_expires_at > v_now
       AND cc.name = c.class
    RETURNING c.lease_expires_at, cc.lease_seconds INTO v_expires, v_lease;
    IF NOT FOUND THEN
        PERFORM ledger.raise_stale(p_campaign_id, p_generation);
    END IF;
    UPDATE ledger.attempt a
       SET last_heartbeat_at = v_now, heartbeat_count = a.heartbeat_count + 1,
           lease_expires_at = v_expires
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
    RETURN QUERY SELECT v_expires, v_lease;
END
$$;

-- The attempt produced a candidate: leased -> attempted. Retrying the
-- identical record (same candidate and fingerprint) after it committed
-- returns its attempt number; anything else needs the live lease.
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
    v_c ledger.campaign := ledger.lease_row(p_campaign_id, p_generation);
    v_a ledger.attempt;
    v_attempt_no integer;
BEGIN
    SELECT * INTO v_a FROM ledger.attempt a
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
    IF v_a.outcome = 'attempted' AND v_a.candidate_sha = p_candidate_sha
       AND v_a.fingerprint = p_fingerprint THEN
        RETURN v_a.attempt_no;  -- this very ending, retried: it is in
    END IF;
    PERFORM ledger.check_live(v_c, p_generation);
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

-- Record many candidates: p_attempts is a JSON array of objects with
-- campaign_id, generation, candidate_sha, fingerprint and optionally
-- base_sha, bundle, bundle_digest, evidence_location, log_tail. Returns one
-- row per item: 'recorded' with its attempt number (also when that very
-- record committed before: a retried batch), or 'stale' (the lease was lost
-- or had expired: stand down for that one). Bad input fails the whole call
-- (LG007), and a repeated failed approach too (LG006), as with record_attempt.
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
    v_done bigint[];
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
    IF (SELECT count(DISTINCT i.campaign_id) <> count(*)
          FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint)) THEN
        RAISE EXCEPTION 'a batch names each campaign once' USING ERRCODE = 'LG007';
    END IF;
    -- Lock the batch's campaigns, in id order as every writer of several
    -- campaigns does; then, on a fresh snapshot, take the live leases.
    PERFORM 1 FROM ledger.campaign c
      JOIN jsonb_to_recordset(p_attempts) AS i(campaign_id bigint) ON i.campaign_id = c.id
     ORDER BY c.id FOR NO KEY UPDATE OF c;
    SELECT coalesce(array_agg(c.id), '{}') INTO v_ids
      FROM ledger.campaign c
      JOIN jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, generation bigint)
        ON i.campaign_id = c.id AND i.generation = c.generation
     WHERE c.state = 'leased' AND c.lease_expires_at > v_now;
    -- Items whose identical record committed before (a retried batch).
    SELECT coalesce(array_agg(a.campaign_id), '{}') INTO v_done
      FROM jsonb_to_recordset(p_attempts)
           AS i(campaign_id bigint, generation bigint, candidate_sha text, fingerprint text)
      JOIN ledger.attempt a ON a.campaign_id = i.campaign_id AND a.generation = i.generation
     WHERE a.outcome = 'attempted' AND a.candidate_sha = i.candidate_sha
       AND a.fingerprint = i.fingerprint;
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
           CASE WHEN i.campaign_id = ANY (v_ids || v_done) THEN 'recorded' ELSE 'stale' END,
           CASE WHEN i.campaign_id = ANY (v_ids || v_done) THEN a.attempt_no END
      FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, generation bigint)
      LEFT JOIN ledger.attempt a ON a.campaign_id = i.campaign_id AND a.generation = i.generation
     ORDER BY i.campaign_id;
END
$$;

-- The attempt failed (or was drained): leased -> ready, maybe -> exhausted.
-- A drained attempt (the worker was shutting down) does not use up the
-- budget. Retrying the identical ending (same reason, same drained) after it
-- committed returns the state it left; anything else needs the live lease.
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
    v_c ledger.campaign := ledger.lease_row(p_campaign_id, p_generation);
    v_a ledger.attempt;
    v_count integer;
    v_next timestamptz;
    v_attempt_no integer;
BEGIN
    IF p_reason IS NULL OR p_reason = '' THEN
        RAISE EXCEPTION 'a failed attempt needs a reason' USING ERRCODE = 'LG007';
    END IF;
    IF p_drained IS NULL THEN
        RAISE EXCEPTION 'drained must be true or false' USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('retry_after_s', p_retry_after_s, 0, 604800, true);
    SELECT * INTO v_a FROM ledger.attempt a
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
    IF v_a.outcome = (CASE WHEN p_drained THEN 'drained' ELSE 'failed' END)
       AND v_a.failure_reason = left(p_reason, 4000) THEN
        -- this very ending, retried: it is in
        RETURN coalesce(ledger.ended_as(p_campaign_id, p_generation, 'fail_attempt'), 'ready');
    END IF;
    PERFORM ledger.check_live(v_c, p_generation);
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

-- Fenced journal append for the lease holder: generation, state and expiry
-- are tested in the same statement that takes the seqs, so a fenced-out
-- batch writes nothing (and, rolled back, wakes nobody). With p_key, a
-- batch whose reply was lost and is sent again returns the seq it got the
-- first time instead of being appended twice (the holder appends one batch
-- at a time, so the last key is all it takes).
-- p_events: [{"type": "output", "payload": {...}, "delta": true}, ...]
DROP FUNCTION IF EXISTS ledger_api.append_events(bigint, bigint, jsonb);
CREATE FUNCTION ledger_api.append_events(p_campaign_id bigint, p_generation bigint, p_events jsonb,
                                         p_key text DEFAULT NULL)
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
    PERFORM ledger.check_lease_args(p_campaign_id, p_generation);
    IF jsonb_typeof(p_events) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'events must be a JSON array' USING ERRCODE = 'LG007';
    END IF;
    IF p_key IS NOT NULL AND length(p_key) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'an append key is 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    v_n := jsonb_array_length(p_events);
    IF v_n = 0 OR v_n > 1000 THEN
        RAISE EXCEPTION 'append 1 to 1000 events at a time, not %', v_n USING ERRCODE = 'LG007';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_events) e
                WHERE jsonb_typeof(e) <> 'object'
                   OR coalesce(e ->> 'type', '') !~ '^[a-z][a-z0-9_.]{0,63}$'
                   OR e ->> 'type' = 'transition'
                   OR (e ? 'payload' AND jsonb_typeof(e -> 'payload') <> 'object')
                   OR (e ? 'delta' AND jsonb_typeof(e -> 'delta') <> 'boolean')) THEN
        RAISE EXCEPTION 'each event needs a type (lowercase, not "transition"), an object payload and a boolean delta'
            USING ERRCODE = 'LG007';
    END IF;
    WITH head AS (
        UPDATE ledger.campaign c
           SET event_seq = c.event_seq + v_n,
               last_append_key = p_key, last_append_seq = c.event_seq + v_n
         WHERE c.id = p_campaign_id AND c.generation = p_generation AND c.state = 'leased'
           AND c.lease_expires_at > ledger.now()
           -- a retry whose first try committed while this one waited for the
           -- row lock: the re-checked row carries its key, so nothing matches
           AND (p_key IS NULL OR c.last_append_key IS DISTINCT FROM p_key)
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
        IF p_key IS NOT NULL THEN
            SELECT c.last_append_seq INTO v_last FROM ledger.campaign c
             WHERE c.id = p_campaign_id AND c.generation = p_generation AND c.last_append_key = p_key;
            IF FOUND THEN
                RETURN v_last;  -- this very batch, retried: it is in
            END IF;
        END IF;
        PERFORM ledger.raise_stale(p_campaign_id, p_generation);
    END IF;
    RETURN v_last;
END
$$;

-- Ask for a side effect (mechanism 9): fenced by generation and liveness,
-- checked against the class's authority profile. A forbidden request is
-- recorded in security_event and answered with status 'forbidden' -- not
-- raised, so the record commits with the refusal. The idempotency key makes
-- a retry return the intent already requested ('existing').
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
    v_c ledger.campaign := ledger.lease_row(p_campaign_id, p_generation);
    v_authority jsonb;
    v_existing ledger.side_effect;
    v_id bigint;
BEGIN
    IF coalesce(p_idempotency_key, '') = '' OR coalesce(p_target, '') = '' THEN
        RAISE EXCEPTION 'a side effect needs a target and an idempotency key' USING ERRCODE = 'LG007';
    END IF;
    SELECT * INTO v_existing FROM ledger.side_effect s WHERE s.idempotency_key = p_idempotency_key;
    IF FOUND THEN
        IF v_existing.campaign_id <> p_campaign_id OR v_existing.generation <> p_generation
           OR v_existing.kind IS DISTINCT FROM p_kind OR v_existing.target <> p_target THEN
            RAISE EXCEPTION 'idempotency key % was used for a different side effect', p_idempotency_key
                USING ERRCODE = 'LG010';
        END IF;
        RETURN QUERY SELECT v_existing.id, 'existing'::text, v_existing.state;
        RETURN;
    END IF;
    PERFORM ledger.check_live(v_c, p_generation);
    IF p_kind IS NULL OR p_kind NOT IN ('git.update_ref', 'http.request') THEN
        RAISE EXCEPTION 'unknown side effect kind %', p_kind USING ERRCODE = 'LG007';
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

------------------------------------------------------------------------------
-- Reaper
------------------------------------------------------------------------------

-- Return expired leases to ready: housekeeping, not the fence (a holder
-- whose lease expired is refused by every write already). Expiry is
-- re-tested by the UPDATE itself: a lease renewed after the candidate list
-- was read (or while this statement waited for the row lock) is not reaped.
-- The lost attempt counts; the generation's pending intents are cancelled
-- (by the journal trigger).
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
    v_cutoff timestamptz;
    v_ids bigint[];
    v_id bigint;
BEGIN
    PERFORM ledger.check_range('grace_s', p_grace_s, 0, 86400);
    PERFORM ledger.check_range('limit', p_limit, 1, 10000);
    v_cutoff := v_now - make_interval(secs => p_grace_s);
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
                    LIMIT p_limit))
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

------------------------------------------------------------------------------
-- Verifiers
------------------------------------------------------------------------------

-- Claim an attempted campaign for verification (SKIP LOCKED, own short
-- lease). Verifications whose verifier vanished lapse here first.
-- Two verifiers never collide on verification_one_running: the campaign row
-- is locked first, and the "no running verification" test is made again,
-- on a fresh snapshot, after the lock (the SELECT's own snapshot predates a
-- verification that another claimer committed while it held the lock).
DROP FUNCTION IF EXISTS ledger_api.claim_verification(text, text, double precision, text[]);
CREATE FUNCTION ledger_api.claim_verification(
        p_verifier text, p_model_family text DEFAULT NULL,
        p_lease_s double precision DEFAULT 120, p_classes text[] DEFAULT NULL)
    RETURNS TABLE (verification_id bigint, campaign_id bigint, generation bigint,
                   attempt_id bigint, attempt_no integer, class text, objective_key text,
                   target text, base_sha text, candidate_sha text, fingerprint text,
                   bundle jsonb, bundle_digest text, acceptance_criteria jsonb,
                   evidence_location text, worker text, lease_expires_at timestamptz,
                   lease_remaining_s double precision)
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
BEGIN
    IF p_verifier IS NULL OR length(p_verifier) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'verifier identity must be 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('lease_s', p_lease_s, 0.001, 86400);
    UPDATE ledger.verification v
       SET status = 'lost', finished_at = v_now, reason = 'verifier lease expired'
     WHERE v.status = 'running' AND v.lease_expires_at <= v_now;

    FOR i IN 1..10 LOOP
        v_c := NULL;
        SELECT c.* INTO v_c
          FROM ledger.campaign c
         WHERE c.state = 'attempted'
           AND (p_classes IS NULL OR c.class = ANY (p_classes))
           AND NOT (c.id = ANY (v_passed))
           AND NOT EXISTS (SELECT 1 FROM ledger.verification v
                            WHERE v.campaign_id = c.id AND v.status = 'running')
           AND NOT EXISTS (SELECT 1 FROM ledger.attempt a
                            WHERE a.campaign_id = c.id AND a.generation = c.generation
                              AND a.worker = p_verifier)
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
                        v_c.evidence_location, v_a.worker, v_expires, p_lease_s;
END
$$;

DROP FUNCTION IF EXISTS ledger_api.heartbeat_verification(bigint, double precision);
CREATE FUNCTION ledger_api.heartbeat_verification(p_verification_id bigint,
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
    UPDATE ledger.verification v
       SET lease_expires_at = v_now + make_interval(secs => p_lease_s)
      FROM ledger.campaign c
     WHERE v.id = p_verification_id AND v.status = 'running' AND v.lease_expires_at > v_now
       AND c.id = v.campaign_id AND c.generation = v.generation AND c.state = 'attempted'
    RETURNING v.lease_expires_at INTO v_expires;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'verification % is no longer current (lapsed, ended, or its campaign moved)',
            p_verification_id USING ERRCODE = 'LG001';
    END IF;
    RETURN QUERY SELECT v_expires, p_lease_s;
END
$$;

-- Shared by accept and reject: the verification and its campaign, locked
-- (campaign first, as every writer does).
DROP FUNCTION IF EXISTS ledger.current_verification(bigint);
CREATE FUNCTION ledger.locked_verification(p_verification_id bigint)
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
CREATE FUNCTION ledger.check_verification_live(p_v ledger.verification)
    RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    v_c ledger.campaign;
    v_worker text;
BEGIN
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_v.campaign_id;
    IF p_v.status <> 'running' OR v_c.generation <> p_v.generation OR v_c.state <> 'attempted' THEN
        RAISE EXCEPTION 'verification % is no longer current (status %, campaign % is % at generation %)',
            p_v.id, p_v.status, v_c.id, v_c.state, v_c.generation
            USING ERRCODE = 'LG001';
    END IF;
    IF p_v.lease_expires_at <= ledger.now() THEN
        RAISE EXCEPTION 'verification % is no longer current: its lease expired at %',
            p_v.id, p_v.lease_expires_at USING ERRCODE = 'LG001';
    END IF;
    SELECT a.worker INTO v_worker FROM ledger.attempt a WHERE a.id = p_v.attempt_id;
    IF v_worker = p_v.verifier THEN
        RAISE EXCEPTION 'a verdict must come from another identity than the worker that made the attempt (%)',
            v_worker USING ERRCODE = 'LG008';
    END IF;
END
$$;

-- The candidate passed: attempted -> verified. If the class promotes, the
-- promotion intent is committed with the verdict (intent before action).
-- A retried accept of a verification already accepted returns its intent.
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
        RETURN coalesce(ledger.ended_as(v_v.campaign_id, v_v.generation, 'reject'), 'ready');
    END IF;
    PERFORM ledger.check_verification_live(v_v);
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

------------------------------------------------------------------------------
-- Dispatchers (the outbox)
------------------------------------------------------------------------------

-- Claim the next due intent whose generation is still live (the journal
-- trigger cancels pending intents of a generation that ended; a claimed one
-- whose dispatcher vanished and whose generation died is cancelled here).
DROP FUNCTION IF EXISTS ledger_api.claim_side_effect(text, double precision, text[]);
CREATE FUNCTION ledger_api.claim_side_effect(p_dispatcher text,
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
CREATE FUNCTION ledger_api.confirm_side_effect(p_side_effect_id bigint, p_claim_token bigint,
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
            UPDATE ledger.campaign c
               SET promoted_at = v_now, promoted_sha = v_s.payload ->> 'new'
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

------------------------------------------------------------------------------
-- Operators
------------------------------------------------------------------------------

-- Stop is a state: any open state -> abandoned, generation bumped so an
-- in-flight worker is fenced out (and told to stop by NOTIFY); the journal
-- trigger cancels pending intents.
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
    IF p_campaign_id IS NULL THEN
        RAISE EXCEPTION 'a campaign id is required' USING ERRCODE = 'LG007';
    END IF;
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
    RETURN v_c.generation + 1;
END
$$;

-- A human grants more attempts: exhausted -> ready.
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
    IF p_campaign_id IS NULL THEN
        RAISE EXCEPTION 'a campaign id is required' USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('extra_attempts', p_extra_attempts, 1, 1000, true);
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign % does not exist', p_campaign_id USING ERRCODE = 'LG004';
    END IF;
    IF v_c.state <> 'exhausted' THEN
        RAISE EXCEPTION 'illegal transition reopen of campaign %: it is %, not exhausted',
            p_campaign_id, v_c.state USING ERRCODE = 'LG002';
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

-- Register or update a campaign class (what the kernel judges: budget, lease,
-- backoff, authority, promotion target). Every number is range-checked here,
-- with the argument's name, before anything is written.
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
    PERFORM ledger.check_range('max_attempts', p_max_attempts, 1, 1000);
    PERFORM ledger.check_range('lease_seconds', p_lease_seconds, 0.001, 604800);
    PERFORM ledger.check_range('backoff_base_s', p_backoff_base_s, 0, 604800);
    PERFORM ledger.check_range('backoff_factor', p_backoff_factor, 1, 1000);
    PERFORM ledger.check_range('backoff_cap_s', p_backoff_cap_s, 0, 604800);
    PERFORM ledger.check_range('backoff_jitter', p_backoff_jitter, 0, 1);
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

-- Retention: drop journal deltas (output, progress) of campaigns closed longer
-- ago than p_older_than_s. Structural events and all records stay.
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
    PERFORM ledger.check_range('older_than_s', p_older_than_s, 0, 1e9);
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

------------------------------------------------------------------------------
-- Sensors: a tick claim retried by its claimant is still its own
------------------------------------------------------------------------------

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
    IF coalesce(p_identity, '') = '' OR coalesce(p_sensor, '') = '' THEN
        RAISE EXCEPTION 'a sensor and an identity are required' USING ERRCODE = 'LG007';
    END IF;
    INSERT INTO ledger.sensor_tick (sensor, tick, claimed_by, claimed_at)
    VALUES (p_sensor, p_tick, p_identity, ledger.now())
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows = 1 OR EXISTS (SELECT 1 FROM ledger.sensor_tick t
                                  WHERE t.sensor = p_sensor AND t.tick = p_tick
                                    AND t.claimed_by = p_identity);
END
$$;

------------------------------------------------------------------------------
-- A verified candidate that lost its promotion's compare-and-swap is worth
-- more than an attempt: the dispatcher rebases it onto the moved target and
-- sends it back for verification (verified -> attempted, a new generation
-- and attempt row that reuse the approach); only a rebase that conflicts
-- returns the campaign to ready, and promote_failed gives the attempt back.
------------------------------------------------------------------------------

INSERT INTO ledger.transition (name, from_state, to_state, owner_role, note) VALUES
    ('rebase', 'verified', 'attempted', 'dispatcher',
     'the target moved: the candidate, rebased cleanly onto it, is verified again');

CREATE FUNCTION ledger_api.rebase_promotion(
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

------------------------------------------------------------------------------
-- Grants for what was (re)created; internal helpers run for nobody else
------------------------------------------------------------------------------

DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT * FROM (VALUES
            ('ledger_api.claim_campaign(text, text[])', 'worker'),
            ('ledger_api.claim_campaigns(text, text[], integer)', 'worker'),
            ('ledger_api.heartbeat(bigint, bigint)', 'worker'),
            ('ledger_api.append_events(bigint, bigint, jsonb, text)', 'worker'),
            ('ledger_api.claim_verification(text, text, double precision, text[])', 'verifier'),
            ('ledger_api.heartbeat_verification(bigint, double precision)', 'verifier'),
            ('ledger_api.claim_side_effect(text, double precision, text[])', 'dispatcher'),
            ('ledger_api.confirm_side_effect(bigint, bigint, double precision)', 'dispatcher'),
            ('ledger_api.rebase_promotion(bigint, bigint, text, text, jsonb, text, text)', 'dispatcher'))
            AS x(fn, actor)
    LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', g.fn);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', g.fn, ledger.role_name(g.actor));
    END LOOP;
    REVOKE ALL ON FUNCTION ledger.check_range(text, double precision, double precision, double precision, boolean),
                           ledger.check_lease_args(bigint, bigint),
                           ledger.lease_row(bigint, bigint),
                           ledger.check_live(ledger.campaign, bigint),
                           ledger.fence(bigint, bigint),
                           ledger.generation_live(ledger.campaign, bigint),
                           ledger.ended_as(bigint, bigint, text),
                           ledger.open_campaign(text, text, text, jsonb, jsonb, integer, text, text[], jsonb, text, boolean),
                           ledger.locked_verification(bigint),
                           ledger.check_verification_live(ledger.verification)
        FROM PUBLIC;
END
$$;
