-- The sensor's API: opening campaigns, recording observations, claiming ticks

-- SECURITY DEFINER, pinned search_path, names schema-qualified; grants.sql
-- grants each to this one role. SQLSTATEs: see api_helpers.sql.

-- Opens a campaign unless one is open for the objective (shared by
-- open_campaign and record_observation). With p_strict, an open campaign
-- whose request differs (desired state, priority, labels, seat, acceptance)
-- is refused with LG011 naming the fields, instead of being returned as if
-- the request had been taken. p_trace_context (the opener's W3C trace
-- context, ledger.is_trace_context) is kept by a campaign this call creates.
CREATE OR REPLACE FUNCTION ledger.open_campaign(
        p_class text, p_objective_key text, p_target text, p_desired_state jsonb,
        p_observation jsonb, p_priority integer, p_seat text, p_labels text[],
        p_acceptance jsonb, p_sensor text, p_strict boolean, p_trace_context jsonb)
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
    v_keys text[];
    v_fair text;
    v_differs jsonb;
BEGIN
    SELECT * INTO v_class FROM ledger.campaign_class cc WHERE cc.name = p_class;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign class % is not registered (run: ledger classes sync)', p_class
            USING ERRCODE = 'LG004';
    END IF;
    PERFORM ledger.check_range('priority', coalesce(p_priority, 0), -1000000, 1000000);
    PERFORM ledger.check_length('objective key', p_objective_key, 1, 500);
    PERFORM ledger.check_length('target', p_target, 1, 2000);
    IF p_trace_context IS NOT NULL AND NOT ledger.is_trace_context(p_trace_context) THEN
        RAISE EXCEPTION 'a trace context is {"traceparent": "00-<32 hex>-<16 hex>-<2 hex>"} '
                        'with an optional "tracestate" of at most 512 characters'
            USING ERRCODE = 'LG007';
    END IF;
    v_seat := coalesce(p_seat, CASE v_class.seat_policy WHEN 'target' THEN p_target END);
    v_acceptance := coalesce(p_acceptance, v_class.acceptance);
    v_labels := coalesce(p_labels, '{}');
    -- the keys it is counted under (limits.sql): the class's templates, its labels
    v_keys := ledger.resolve_limit_keys(v_class.limit_keys, p_class, p_target, v_labels);
    v_fair := ledger.resolve_fair_key(v_class.fair_key, p_class, p_target, v_labels);
    IF v_fair IS NOT NULL AND NOT v_fair = ANY (v_keys) THEN
        v_keys := ARRAY(SELECT DISTINCT k FROM unnest(v_keys || v_fair) k ORDER BY k);
    END IF;
    IF cardinality(v_keys) > 0 THEN
        PERFORM ledger.ensure_limit_keys(v_keys);
    END IF;
    FOR i IN 1..3 LOOP
        PERFORM ledger.begin_transition('open', 'sensor', p_sensor,
                                        jsonb_build_object('observation', coalesce(p_observation, '{}')));
        INSERT INTO ledger.campaign AS c
               (class, objective_key, target, desired_state, opening_observation, state,
                max_attempts, next_attempt_at, acceptance_criteria, seat, priority, labels,
                created_at, updated_at, trace_context, limit_keys, resources, max_cost, fair_key)
        VALUES (p_class, p_objective_key, p_target, coalesce(p_desired_state, '{}'),
                coalesce(p_observation, '{}'), 'ready', v_class.max_attempts, ledger.now(),
                v_acceptance, v_seat, coalesce(p_priority, 0), v_labels, ledger.now(), ledger.now(),
                p_trace_context, v_keys, v_class.resources, v_class.max_cost, v_fair)
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
        p_acceptance jsonb DEFAULT NULL, p_sensor text DEFAULT NULL,
        p_trace_context jsonb DEFAULT NULL)
    RETURNS TABLE (campaign_id bigint, created boolean, state text, generation bigint)
    LANGUAGE sql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM ledger.open_campaign(p_class, p_objective_key, p_target, p_desired_state,
                                       p_observation, p_priority, p_seat, p_labels,
                                       p_acceptance, coalesce(p_sensor, 'sensor'), true,
                                       p_trace_context)
$$;
COMMENT ON FUNCTION ledger_api.open_campaign IS
    'Open a campaign for an objective; the identical request returns the open one, a different one is refused (LG011).';

-- Why a green observation cannot confirm a campaign opened with a baseline
-- (the tests that failed at opening, details.tests.failed of its opening
-- observation), or NULL if it can: every one of them must be among the tests
-- the observation saw set up, called and passing in a judged run
-- (details.tests.judged: the fixed judge's stream, complete and consistent):
-- in details.tests.passed_ids, or -- for a suite too large to list -- by the
-- first 12 hex digits of its SHA-256 in details.tests.passed_sha256. A module
-- that failed to collect at opening is met by passing tests inside it
-- (passed_modules). Without a baseline there is nothing to show.
CREATE OR REPLACE FUNCTION ledger.baseline_unmet(p_opening jsonb, p_details jsonb)
    RETURNS text
    LANGUAGE plpgsql
    IMMUTABLE
AS $$
DECLARE
    v_failed jsonb := p_opening -> 'details' -> 'tests' -> 'failed';
    v_tests jsonb := p_details -> 'tests';
    v_passed jsonb;
    v_missing text[];
BEGIN
    IF jsonb_typeof(v_failed) IS DISTINCT FROM 'array' OR jsonb_array_length(v_failed) = 0 THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v_tests) IS DISTINCT FROM 'object' OR v_tests -> 'judged' IS DISTINCT FROM 'true'
       OR (jsonb_typeof(v_tests -> 'passed_ids') IS DISTINCT FROM 'array'
           AND jsonb_typeof(v_tests -> 'passed_sha256') IS DISTINCT FROM 'array') THEN
        RETURN format('not confirmed: the campaign opened with %s failing test(s), and this observation '
                      'shows no judged test run that could show them passing', jsonb_array_length(v_failed));
    END IF;
    v_passed := coalesce(v_tests -> 'passed_ids', '[]');
    SELECT array_agg(f.id ORDER BY f.n) INTO v_missing
      FROM jsonb_array_elements_text(v_failed) WITH ORDINALITY AS f(id, n)
     WHERE NOT v_passed ? f.id
       AND NOT coalesce(v_tests -> 'passed_sha256', '[]')
               ? left(encode(sha256(convert_to(f.id, 'UTF8')), 'hex'), 12)
       AND NOT (position('::' IN f.id) = 0 AND (
                    coalesce(v_tests -> 'passed_modules', '[]') ? f.id
                    OR EXISTS (SELECT 1 FROM jsonb_array_elements_text(v_passed) p(id)
                                WHERE starts_with(p.id, f.id || '::'))));
    IF v_missing IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN left(format('not confirmed: %s test(s) that failed at opening were not seen passing: %s%s',
                       cardinality(v_missing), array_to_string(v_missing[1:10], ', '),
                       CASE WHEN cardinality(v_missing) > 10
                            THEN format(' and %s more', cardinality(v_missing) - 10) ELSE '' END), 4000);
END
$$;

-- Serialises the observations of one objective (record_observation and the
-- worker's reobserve): the streak an observation counts in is then read with
-- every earlier one committed -- two sensors' reds recorded at once would
-- otherwise each see a streak of one.
CREATE OR REPLACE FUNCTION ledger.lock_objective(p_objective_key text)
    RETURNS void
    LANGUAGE sql
AS $$
    SELECT pg_catalog.pg_advisory_xact_lock(
               pg_catalog.hashtextextended('ledger.objective ' || coalesce(p_objective_key, ''), 0))
$$;

-- Why an error observation is one, for its reason column: what the check
-- said went wrong (details.error), bounded.
CREATE OR REPLACE FUNCTION ledger.error_reason(p_details jsonb)
    RETURNS text
    LANGUAGE sql
    IMMUTABLE
AS $$
    SELECT left(coalesce(nullif(p_details ->> 'error', ''),
                         'the check failed without saying why'), 4000)
$$;

-- Records an observation and applies what it implies: open, regress,
-- confirm or dismiss.
--
-- Three outcomes (p_status). green and red say what the target is. error
-- says the check itself failed (an exit code it does not declare red, a
-- timeout, a check killed by its cell, a cell that could not be built, a
-- pytest run the judge cannot trust): it is kept with its evidence and its
-- reason (details.error), links to no campaign and moves none; the open
-- campaign's journal hears of it once per streak of the sensor's errors.
--
-- Hysteresis: a red opens a campaign, or regresses a promoted one, only as
-- the p_open_after-th red in a row of its objective; a green confirms, or
-- dismisses, only as the p_confirm_after-th green in a row (for a
-- confirmation, each one started after the promotion and showing the
-- opening baseline's tests pass, ledger.baseline_unmet). Errors neither
-- break a streak nor lengthen it. The transition's journal event names the
-- observations that counted ("counted", newest first); one of a streak still
-- too short says so in its reason (and in the campaign's journal, if one is
-- open). Both default to 1: every green or red counts at once.
--
-- (Also: a campaign opened meanwhile by another sensor is no conflict.)
CREATE OR REPLACE FUNCTION ledger_api.record_observation(
        p_sensor text, p_objective_key text, p_target text, p_status text,
        p_started_at timestamptz, p_finished_at timestamptz DEFAULT NULL,
        p_details jsonb DEFAULT '{}', p_class text DEFAULT NULL, p_tick timestamptz DEFAULT NULL,
        p_idempotency_key text DEFAULT NULL, p_request_digest text DEFAULT NULL,
        p_desired_state jsonb DEFAULT '{}', p_labels text[] DEFAULT '{}',
        p_trace_context jsonb DEFAULT NULL,
        p_open_after integer DEFAULT 1, p_confirm_after integer DEFAULT 1)
    RETURNS TABLE (observation_id bigint, campaign_id bigint, effect text, duplicate boolean,
                   reason text)
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
    v_reason text;
    v_campaign bigint;
    v_transition text;
    v_to text;
    v_promoted boolean;
    v_need integer;
    v_streak bigint[] := '{}';
    v_row record;
BEGIN
    IF p_status IS NULL OR p_status NOT IN ('green', 'red', 'error') THEN
        RAISE EXCEPTION 'observation status must be green, red or error, not %', coalesce(p_status, 'null')
            USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('open_after', p_open_after, 1, 100);
    PERFORM ledger.check_range('confirm_after', p_confirm_after, 1, 100);
    IF p_started_at IS NULL OR p_started_at > v_now OR p_started_at < '2000-01-01 00:00:00+00' THEN
        RAISE EXCEPTION 'observation start % must be given, not in the future and not before 2000',
            p_started_at USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.lock_objective(p_objective_key);

    INSERT INTO ledger.observation AS o
           (sensor, target, objective_key, class, status, started_at, finished_at, tick, details,
            effect, idempotency_key, request_digest, recorded_at, reason)
    VALUES (p_sensor, p_target, p_objective_key, p_class, p_status, p_started_at,
            coalesce(p_finished_at, v_now), p_tick, coalesce(p_details, '{}'), 'recorded',
            p_idempotency_key, p_request_digest, v_now,
            CASE WHEN p_status = 'error' THEN ledger.error_reason(p_details) END)
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
        RETURN QUERY SELECT v_obs.id, v_obs.campaign_id, v_obs.effect, true, v_obs.reason;
        RETURN;
    END IF;

    SELECT * INTO v_c FROM ledger.campaign c
     WHERE c.objective_key = p_objective_key
       AND c.state NOT IN ('confirmed', 'dismissed', 'abandoned')
       FOR UPDATE;

    IF p_status = 'error' THEN
        -- The check's own failure says nothing of the target.
        IF v_c.id IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM (SELECT o.status FROM ledger.observation o
                               WHERE o.sensor = p_sensor AND o.id < v_obs.id
                               ORDER BY o.id DESC LIMIT 1) previous
                WHERE previous.status = 'error') THEN
            PERFORM ledger.append_event(v_c.id, 'observation.error', p_sensor,
                        jsonb_build_object('observation_id', v_obs.id, 'reason', v_obs.reason));
        END IF;
        RETURN QUERY SELECT v_obs.id, NULL::bigint, v_obs.effect, false, v_obs.reason;
        RETURN;
    END IF;

    -- Only an observation that started after the promotion can confirm or
    -- regress it; a green one confirms only what it shows: the opening's
    -- failures passing.
    v_promoted := v_c.state = 'verified' AND v_c.promoted_at IS NOT NULL
                  AND p_started_at > v_c.promoted_at;
    IF p_status = 'red' THEN
        IF v_c.id IS NULL THEN
            IF p_class IS NULL THEN
                RAISE EXCEPTION 'a red observation of % opens a campaign, so it needs a class',
                    p_objective_key USING ERRCODE = 'LG007';
            END IF;
            v_transition := 'open';
        ELSIF v_promoted THEN
            v_transition := 'regress'; v_to := 'ready';
        END IF;
    ELSIF v_promoted THEN
        v_reason := ledger.baseline_unmet(v_c.opening_observation, p_details);
        IF v_reason IS NULL THEN
            v_transition := 'confirm'; v_to := 'confirmed';
        END IF;
    ELSIF v_c.state IN ('ready', 'exhausted') AND NOT EXISTS (
              SELECT 1 FROM ledger.side_effect s
               WHERE s.campaign_id = v_c.id AND s.state IN ('pending', 'claimed')) THEN
        v_transition := 'dismiss'; v_to := 'dismissed';
    END IF;

    IF v_transition IS NOT NULL THEN
        -- The streak: this observation and the green and red ones of the
        -- objective before it (errors left out), newest first, for as long
        -- as each could have made this same move.
        v_need := CASE p_status WHEN 'red' THEN p_open_after ELSE p_confirm_after END;
        FOR v_row IN SELECT o.id, o.status, o.started_at, o.details FROM ledger.observation o
                      WHERE o.objective_key = p_objective_key AND o.status <> 'error'
                        AND o.id <= v_obs.id
                      ORDER BY o.id DESC LIMIT v_need
        LOOP
            EXIT WHEN v_row.status <> p_status
                   OR (v_transition IN ('regress', 'confirm') AND v_row.started_at <= v_c.promoted_at)
                   OR (v_transition = 'confirm' AND v_row.id <> v_obs.id
                       AND ledger.baseline_unmet(v_c.opening_observation, v_row.details) IS NOT NULL);
            v_streak := v_streak || v_row.id;
        END LOOP;
        IF cardinality(v_streak) < v_need THEN
            v_reason := format('%s of the %s %s observations in a row needed to %s', cardinality(v_streak),
                               v_need, p_status, CASE v_transition WHEN 'open' THEN 'open a campaign'
                                                                    ELSE v_transition END);
            v_transition := NULL;
        END IF;
    END IF;

    IF v_transition = 'open' THEN
        SELECT o.campaign_id, CASE WHEN o.created THEN 'opened' ELSE 'recorded' END
          INTO v_campaign, v_effect
          FROM ledger.open_campaign(p_class, p_objective_key, p_target, p_desired_state,
                                    jsonb_build_object('observation_id', v_obs.id,
                                                       'status', p_status,
                                                       'started_at', p_started_at,
                                                       'details', coalesce(p_details, '{}'),
                                                       'counted', to_jsonb(v_streak)),
                                    0, NULL, p_labels, NULL, p_sensor, false,
                                    p_trace_context) o;
    ELSIF v_transition IS NOT NULL THEN
        v_effect := CASE v_transition WHEN 'regress' THEN 'regressed' ELSE v_to END;
        PERFORM ledger.begin_transition(v_transition, 'sensor', p_sensor,
                    jsonb_build_object('observation_id', v_obs.id, 'status', p_status,
                                       'started_at', p_started_at, 'counted', to_jsonb(v_streak)));
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
        -- A regression is the promoted attempt's own failure (it stays
        -- charged): with the budget spent, the campaign is exhausted, not
        -- attempted again.
        IF v_to = 'ready' THEN
            PERFORM ledger.exhaust_if_spent(v_c.id);
        END IF;
    END IF;
    v_campaign := coalesce(v_campaign, v_c.id);
    UPDATE ledger.observation o SET effect = v_effect, campaign_id = v_campaign, reason = v_reason
     WHERE o.id = v_obs.id;
    IF v_reason IS NOT NULL AND v_c.id IS NOT NULL THEN
        PERFORM ledger.append_event(v_c.id, CASE WHEN v_need IS NULL THEN 'observation.not_confirming'
                                                 ELSE 'observation.streak' END, p_sensor,
                    jsonb_build_object('observation_id', v_obs.id, 'status', p_status, 'reason', v_reason)
                    || CASE WHEN v_need IS NULL THEN '{}'::jsonb
                            ELSE jsonb_build_object('streak', to_jsonb(v_streak), 'needed', v_need) END);
    END IF;
    RETURN QUERY SELECT v_obs.id, v_campaign, v_effect, false, v_reason;
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
