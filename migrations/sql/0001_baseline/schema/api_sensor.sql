-- The sensor's API: opening campaigns, recording observations, claiming ticks

-- SECURITY DEFINER, pinned search_path, names schema-qualified; grants.sql
-- grants each to this one role. SQLSTATEs: see api_helpers.sql.

-- Opens a campaign unless one is open for the objective (shared by
-- open_campaign and record_observation). With p_strict, an open campaign
-- whose request differs (desired state, priority, labels, seat, acceptance)
-- is refused with LG011 naming the fields, instead of being returned as if
-- the request had been taken.
CREATE OR REPLACE FUNCTION ledger.open_campaign(
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
        ELSIF v_c.state IN ('ready', 'exhausted') AND NOT EXISTS (
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

-- Registers a sensor the first time it runs; returns when it was registered.
CREATE OR REPLACE FUNCTION ledger_api.register_sensor(p_sensor text, p_identity text)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_at timestamptz;
BEGIN
    IF p_sensor IS NULL OR length(p_sensor) NOT BETWEEN 1 AND 200
       OR p_identity IS NULL OR length(p_identity) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'a sensor name and an identity of 1 to 200 characters are needed'
            USING ERRCODE = 'LG007';
    END IF;
    INSERT INTO ledger.sensor (name, registered_at, registered_by)
    VALUES (p_sensor, ledger.now(), p_identity)
    ON CONFLICT (name) DO NOTHING;
    SELECT s.registered_at INTO v_at FROM ledger.sensor s WHERE s.name = p_sensor;
    RETURN v_at;
END
$$;
