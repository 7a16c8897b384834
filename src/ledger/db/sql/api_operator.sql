-- The operator's API: abandon, reopen, classes, retention

-- SECURITY DEFINER, pinned search_path, names schema-qualified; grants.sql
-- grants each to this one role. SQLSTATEs: see api_helpers.sql.

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

-- Approve a campaign's candidate that awaits approval (approval.sql):
-- awaiting_approval -> verified, its promotion requested (the dispatchers
-- woken) with the verdicts' frozen landing. By the operator role only, and
-- never by the identity that made the attempt (LG008); journaled with the
-- operator's identity and reason. A retry of the same approval by the same
-- operator returns it again; a decided approval is not decided again.
CREATE OR REPLACE FUNCTION ledger_api.approve(p_campaign_id bigint, p_operator text,
                                              p_reason text DEFAULT NULL)
    RETURNS TABLE (approval_id bigint, decision text, state text, generation bigint,
                   side_effect_id bigint)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF length(p_reason) > 4000 THEN
        RAISE EXCEPTION 'a reason is at most 4000 characters' USING ERRCODE = 'LG007';
    END IF;
    RETURN QUERY SELECT * FROM ledger.operator_decision(p_campaign_id, p_operator, 'approve',
                                                        nullif(btrim(p_reason), ''));
END
$$;
COMMENT ON FUNCTION ledger_api.approve IS
    'Approve a candidate that awaits approval: its promotion is requested (journaled with the operator).';

-- Deny it: awaiting_approval -> ready (the reason shown to the next attempt
-- as a rejection, the approach refused; exhausted if the attempts are
-- spent), or, with p_abandon, -> abandoned. A reason is required. As
-- approve: the operator role only, never the attempt's identity, journaled.
CREATE OR REPLACE FUNCTION ledger_api.deny(p_campaign_id bigint, p_operator text, p_reason text,
                                           p_abandon boolean DEFAULT false)
    RETURNS TABLE (approval_id bigint, decision text, state text, generation bigint,
                   side_effect_id bigint)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM ledger.check_length('reason', btrim(p_reason), 1, 4000);
    RETURN QUERY SELECT * FROM ledger.operator_decision(
        p_campaign_id, p_operator, CASE WHEN coalesce(p_abandon, false) THEN 'abandon' ELSE 'deny' END,
        btrim(p_reason));
END
$$;
COMMENT ON FUNCTION ledger_api.deny IS
    'Deny a candidate that awaits approval: back to ready with the reason, or abandoned (journaled).';

-- Register or update a campaign class (what the kernel judges: budget, lease,
-- backoff, authority, promotion target, approval). Every number is
-- range-checked here, with the argument's name, before anything is written.
-- p_approval NULL (a caller of a release before approvals) keeps the
-- class's policy as it is.
CREATE OR REPLACE FUNCTION ledger_api.register_class(
        p_name text, p_max_attempts integer DEFAULT 3, p_lease_seconds double precision DEFAULT 60,
        p_backoff_base_s double precision DEFAULT 5, p_backoff_factor double precision DEFAULT 2,
        p_backoff_cap_s double precision DEFAULT 600, p_backoff_jitter double precision DEFAULT 0.1,
        p_seat_policy text DEFAULT 'none', p_authority jsonb DEFAULT '{}',
        p_acceptance jsonb DEFAULT '{}', p_promotion jsonb DEFAULT '{}',
        p_verifier text DEFAULT 'command', p_weight integer DEFAULT 1,
        p_heartbeat_seconds double precision DEFAULT NULL, p_verifiers text[] DEFAULT NULL,
        p_approval jsonb DEFAULT NULL)
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
    PERFORM ledger.check_range('weight', p_weight, 1, 1000);
    PERFORM ledger.check_range('heartbeat_seconds', p_heartbeat_seconds, 0.001, 604800, true);
    IF p_promotion ? 'merge_queue' THEN
        -- the merge queue's knobs (merge_queue.sql), checked here as they are stored
        IF jsonb_typeof(p_promotion -> 'merge_queue') IS DISTINCT FROM 'object'
           OR jsonb_typeof(coalesce(p_promotion -> 'merge_queue' -> 'batch_size', '1')) <> 'number'
           OR jsonb_typeof(coalesce(p_promotion -> 'merge_queue' -> 'max_wait_s', '0')) <> 'number' THEN
            RAISE EXCEPTION 'promotion.merge_queue must be an object of numbers {batch_size, max_wait_s}'
                USING ERRCODE = 'LG007';
        END IF;
        PERFORM ledger.check_range('merge_queue.batch_size',
                    coalesce((p_promotion -> 'merge_queue' ->> 'batch_size')::numeric, 8), 1, 64);
        PERFORM ledger.check_range('merge_queue.max_wait_s',
                    coalesce((p_promotion -> 'merge_queue' ->> 'max_wait_s')::numeric, 0), 0, 3600);
    END IF;
    IF p_heartbeat_seconds >= p_lease_seconds THEN
        RAISE EXCEPTION 'heartbeat_seconds (%) must be shorter than lease_seconds (%)',
            p_heartbeat_seconds, p_lease_seconds USING ERRCODE = 'LG007';
    END IF;
    IF p_verifiers IS NOT NULL AND (cardinality(p_verifiers) NOT BETWEEN 1 AND 8
                                    OR p_verifiers[1] IS DISTINCT FROM p_verifier
                                    OR array_position(p_verifiers, NULL) IS NOT NULL
                                    OR cardinality(p_verifiers) <> (SELECT count(DISTINCT k)
                                                                      FROM unnest(p_verifiers) k)) THEN
        RAISE EXCEPTION 'verifiers (the quorum) must list 1 to 8 distinct kinds, the first being verifier (%)',
            p_verifier USING ERRCODE = 'LG007';
    END IF;
    INSERT INTO ledger.campaign_class AS cc
           (name, max_attempts, lease_seconds, backoff_base_s, backoff_factor, backoff_cap_s,
            backoff_jitter, seat_policy, authority, acceptance, promotion, verifier, verifiers, weight,
            heartbeat_seconds, approval, created_at, updated_at)
    VALUES (p_name, p_max_attempts, p_lease_seconds, p_backoff_base_s, p_backoff_factor,
            p_backoff_cap_s, p_backoff_jitter, p_seat_policy, coalesce(p_authority, '{}'),
            coalesce(p_acceptance, '{}'), coalesce(p_promotion, '{}'), p_verifier,
            coalesce(p_verifiers, ARRAY[p_verifier]), p_weight, p_heartbeat_seconds,
            ledger.check_approval_policy(p_approval), v_now, v_now)
    ON CONFLICT (name) DO UPDATE
       SET max_attempts = excluded.max_attempts, lease_seconds = excluded.lease_seconds,
           backoff_base_s = excluded.backoff_base_s, backoff_factor = excluded.backoff_factor,
           backoff_cap_s = excluded.backoff_cap_s, backoff_jitter = excluded.backoff_jitter,
           seat_policy = excluded.seat_policy, authority = excluded.authority,
           acceptance = excluded.acceptance, promotion = excluded.promotion,
           verifier = excluded.verifier, verifiers = excluded.verifiers, weight = excluded.weight,
           heartbeat_seconds = excluded.heartbeat_seconds,
           approval = CASE WHEN p_approval IS NULL THEN cc.approval ELSE excluded.approval END,
           updated_at = v_now;
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

-- An operator skips the rest of a ready campaign's backoff. Not a state
-- change (ready stays ready), so not a transition: a journaled operator event
-- that moves next_attempt_at to now, refused (LG002) unless the campaign is
-- ready and still waiting.
CREATE OR REPLACE FUNCTION ledger_api.retry_now(p_campaign_id bigint, p_operator text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
    v_seq bigint;
BEGIN
    IF p_campaign_id IS NULL THEN
        RAISE EXCEPTION 'retry now needs a campaign id' USING ERRCODE = 'LG007';
    END IF;
    -- The row lock orders this against a claim: a worker that claimed first
    -- made it leased (refused below); one that claims after sees now.
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign % does not exist', p_campaign_id USING ERRCODE = 'LG004';
    END IF;
    IF v_c.state <> 'ready' OR v_c.next_attempt_at <= v_now THEN
        RAISE EXCEPTION 'retry now: campaign % is %, not ready and waiting out a backoff',
            p_campaign_id,
            CASE WHEN v_c.state = 'ready' THEN 'ready with no wait left' ELSE v_c.state END
            USING ERRCODE = 'LG002';
    END IF;
    UPDATE ledger.campaign c SET next_attempt_at = v_now WHERE c.id = p_campaign_id;
    PERFORM pg_catalog.set_config('ledger.actor_role', 'operator', true);
    v_seq := ledger.append_event(p_campaign_id, 'operator.retry_now',
                                 coalesce(p_operator, 'operator'),
                                 jsonb_build_object('waited_until', v_c.next_attempt_at,
                                                    'attempt_count', v_c.attempt_count));
    PERFORM pg_catalog.set_config('ledger.actor_role', '', true);
    PERFORM pg_notify('ledger_ready', p_campaign_id::text);  -- a hint: workers wake
    RETURN v_seq;
END
$$;
COMMENT ON FUNCTION ledger_api.retry_now IS
    'Skip the rest of a ready campaign''s backoff (journaled); refused unless it is waiting.';

-- Pause a class: claims skip it from the moment this commits (the claim
-- functions test campaign_class.paused_at), attempts in flight finish and
-- everything after them (verification, promotion) goes on. A class has no
-- campaign journal: the pause is journaled in ledger.class_event with the
-- operator's identity and reason. Pausing a paused class changes nothing
-- (changed = false). Registering the class again keeps it paused.
CREATE OR REPLACE FUNCTION ledger_api.pause_class(p_name text, p_reason text DEFAULT NULL,
                                                  p_operator text DEFAULT NULL)
    RETURNS TABLE (class text, paused_at timestamptz, changed boolean)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_cc ledger.campaign_class;
    v_reason text := nullif(btrim(p_reason), '');
BEGIN
    IF length(v_reason) > 1000 THEN
        RAISE EXCEPTION 'a reason is at most 1000 characters' USING ERRCODE = 'LG007';
    END IF;
    SELECT * INTO v_cc FROM ledger.campaign_class cc WHERE cc.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign class % is not registered', p_name USING ERRCODE = 'LG004';
    END IF;
    IF v_cc.paused_at IS NOT NULL THEN
        RETURN QUERY SELECT v_cc.name, v_cc.paused_at, false;
        RETURN;
    END IF;
    UPDATE ledger.campaign_class cc SET paused_at = v_now WHERE cc.name = p_name;
    INSERT INTO ledger.class_event (class, type, actor, actor_role, reason, created_at)
    VALUES (p_name, 'class.paused', left(coalesce(nullif(p_operator, ''), 'operator'), 200),
            'operator', v_reason, v_now);
    RETURN QUERY SELECT v_cc.name, v_now, true;
END
$$;
COMMENT ON FUNCTION ledger_api.pause_class IS
    'Pause a class: claims skip it, attempts in flight finish (journaled in ledger.class_event).';

-- Resume a paused class: claimable again at once (workers are woken with a
-- hint for its first ready campaign). Resuming a class that is not paused
-- changes nothing (changed = false).
CREATE OR REPLACE FUNCTION ledger_api.resume_class(p_name text, p_operator text DEFAULT NULL)
    RETURNS TABLE (class text, paused_at timestamptz, changed boolean)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_cc ledger.campaign_class;
    v_head bigint;
BEGIN
    SELECT * INTO v_cc FROM ledger.campaign_class cc WHERE cc.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign class % is not registered', p_name USING ERRCODE = 'LG004';
    END IF;
    IF v_cc.paused_at IS NULL THEN
        RETURN QUERY SELECT v_cc.name, NULL::timestamptz, false;
        RETURN;
    END IF;
    UPDATE ledger.campaign_class cc SET paused_at = NULL WHERE cc.name = p_name;
    INSERT INTO ledger.class_event (class, type, actor, actor_role, reason, created_at)
    VALUES (p_name, 'class.resumed', left(coalesce(nullif(p_operator, ''), 'operator'), 200),
            'operator', NULL, v_now);
    SELECT c.id INTO v_head FROM ledger.campaign c
     WHERE c.class = p_name AND c.state = 'ready'
     ORDER BY c.priority DESC, c.created_at, c.id LIMIT 1;
    IF v_head IS NOT NULL THEN
        PERFORM pg_notify('ledger_ready', v_head::text);  -- a hint: workers wake
    END IF;
    RETURN QUERY SELECT v_cc.name, NULL::timestamptz, true;
END
$$;
COMMENT ON FUNCTION ledger_api.resume_class IS
    'Resume a paused class: claimable again (journaled in ledger.class_event).';

-- --- the HTTP server's sign-ins and bulk jobs (web.sql) ------------------------

-- A new sign-in; expired sessions (a day past their end) are cleared on the way.
CREATE OR REPLACE FUNCTION ledger_api.start_web_session(
        p_id_digest text, p_token_name text, p_token_role text, p_token_digest text,
        p_csrf text, p_ttl_s double precision)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := ledger.now();
    v_expires timestamptz;
BEGIN
    PERFORM ledger.check_range('ttl_s', p_ttl_s, 1, 604800);
    DELETE FROM ledger.web_session s WHERE s.expires_at < v_now - interval '1 day';
    v_expires := v_now + make_interval(secs => p_ttl_s);
    INSERT INTO ledger.web_session (id_digest, token_name, token_role, token_digest, csrf,
                                    created_at, expires_at)
    VALUES (p_id_digest, p_token_name, p_token_role, p_token_digest, p_csrf, v_now, v_expires);
    RETURN v_expires;
END
$$;
COMMENT ON FUNCTION ledger_api.start_web_session IS
    'Record a dashboard sign-in (the session id''s digest, the token that made it, its CSRF token).';

-- The live sign-in of a session id digest: not signed out, not expired.
CREATE OR REPLACE FUNCTION ledger_api.web_session(p_id_digest text)
    RETURNS TABLE (token_name text, token_role text, token_digest text, csrf text,
                   expires_at timestamptz)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.token_name, s.token_role, s.token_digest, s.csrf, s.expires_at
      FROM ledger.web_session s
     WHERE s.id_digest = p_id_digest AND s.ended_at IS NULL AND s.expires_at > ledger.now()
$$;

-- Sign out: this session, or (p_everywhere) every live session of its token.
CREATE OR REPLACE FUNCTION ledger_api.end_web_sessions(p_id_digest text, p_everywhere boolean DEFAULT false)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_s ledger.web_session;
    v_n integer;
BEGIN
    SELECT * INTO v_s FROM ledger.web_session s WHERE s.id_digest = p_id_digest;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    UPDATE ledger.web_session s SET ended_at = ledger.now()
     WHERE s.ended_at IS NULL
       AND (s.id_digest = p_id_digest
            OR (coalesce(p_everywhere, false) AND s.token_name = v_s.token_name
                AND s.token_digest = v_s.token_digest));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- A confirmed bulk action begins: refused (LG007) if its selection was acted on before.
CREATE OR REPLACE FUNCTION ledger_api.start_bulk_job(
        p_job_id text, p_selection text, p_operator text, p_action text, p_campaign_ids bigint[],
        p_details jsonb DEFAULT '{}')
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := ledger.now();
BEGIN
    INSERT INTO ledger.bulk_job (id, selection, operator, action, total, details, created_at, updated_at)
    VALUES (p_job_id, p_selection, p_operator, p_action, coalesce(cardinality(p_campaign_ids), 0),
            coalesce(p_details, '{}'), v_now, v_now)
    ON CONFLICT (selection) DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'this preview was acted on already: preview again' USING ERRCODE = 'LG007';
    END IF;
    RETURN p_job_id;
END
$$;

-- One campaign of a bulk job acted on, and what became of it.
CREATE OR REPLACE FUNCTION ledger_api.record_bulk_item(p_job_id text, p_campaign_id bigint, p_outcome text)
    RETURNS void
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO ledger.bulk_job_item (job_id, campaign_id, outcome, at)
    VALUES (p_job_id, p_campaign_id, p_outcome, ledger.now())
    ON CONFLICT (job_id, campaign_id) DO NOTHING;
    UPDATE ledger.bulk_job j SET updated_at = ledger.now() WHERE j.id = p_job_id;
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.finish_bulk_job(p_job_id text, p_state text)
    RETURNS void
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE ledger.bulk_job j SET state = p_state, finished_at = ledger.now(), updated_at = ledger.now()
     WHERE j.id = p_job_id AND j.state = 'running';
END
$$;

-- A bulk job's progress: per outcome how many; every item once it has ended.
CREATE OR REPLACE FUNCTION ledger_api.bulk_job(p_job_id text)
    RETURNS TABLE (id text, operator text, action text, total integer, done integer,
                   outcomes jsonb, state text, details jsonb, items jsonb,
                   created_at timestamptz, updated_at timestamptz)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.id, j.operator, j.action, j.total,
           (SELECT count(*)::integer FROM ledger.bulk_job_item i WHERE i.job_id = j.id),
           (SELECT coalesce(jsonb_object_agg(o.outcome, o.n), '{}')
              FROM (SELECT i.outcome, count(*) AS n FROM ledger.bulk_job_item i
                     WHERE i.job_id = j.id GROUP BY i.outcome) o),
           j.state, j.details,
           CASE WHEN j.state <> 'running' THEN
               (SELECT coalesce(jsonb_agg(jsonb_build_object('campaign_id', i.campaign_id,
                                                             'outcome', i.outcome)
                                          ORDER BY i.at, i.campaign_id), '[]')
                  FROM ledger.bulk_job_item i WHERE i.job_id = j.id)
           END,
           j.created_at, j.updated_at
      FROM ledger.bulk_job j WHERE j.id = p_job_id
$$;

-- The server's own secret of this name, made on first use (from the server's
-- strong random source: gen_random_uuid).
CREATE OR REPLACE FUNCTION ledger_api.server_secret(p_name text)
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO ledger.server_secret (name, value)
    VALUES (p_name, encode(sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8')), 'hex'))
    ON CONFLICT (name) DO NOTHING;
    RETURN (SELECT s.value FROM ledger.server_secret s WHERE s.name = p_name);
END
$$;

-- Limits (limits.sql): a key's caps, set live. NULL lifts a cap; every
-- figure is range-checked here, with its name. Journaled (limit_event)
-- with the operator and the figures before and after.
CREATE OR REPLACE FUNCTION ledger_api.set_limit(
        p_key text, p_max_leased integer DEFAULT NULL, p_max_verifying integer DEFAULT NULL,
        p_max_cost_per_day double precision DEFAULT NULL, p_weight integer DEFAULT 1,
        p_operator text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_before ledger.limit_key;
BEGIN
    IF p_key IS NULL OR p_key !~ '^[a-z][a-z0-9_.-]{0,31}:[^[:space:]]{1,200}$' THEN
        RAISE EXCEPTION 'a limit key is KIND:VALUE (KIND lowercase, 1 to 32 characters; VALUE 1 to 200 '
                        'characters without spaces), such as repo:app or tenant:acme, not %',
            coalesce(quote_literal(p_key), 'NULL') USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('max_leased', p_max_leased, 0, 1000000, true);
    PERFORM ledger.check_range('max_verifying', p_max_verifying, 0, 1000000, true);
    PERFORM ledger.check_range('max_cost_per_day', p_max_cost_per_day, 0, 1000000000, true);
    PERFORM ledger.check_range('weight', p_weight, 1, 1000);
    PERFORM ledger.check_length('operator', coalesce(p_operator, 'operator'), 1, 200);
    SELECT * INTO v_before FROM ledger.limit_key k WHERE k.key = p_key;
    INSERT INTO ledger.limit_key AS k (key, max_leased, max_verifying, max_cost_per_day, weight,
                                       updated_at, updated_by)
    VALUES (p_key, p_max_leased, p_max_verifying, p_max_cost_per_day, p_weight, ledger.now(),
            coalesce(p_operator, 'operator'))
    ON CONFLICT (key) DO UPDATE
       SET max_leased = excluded.max_leased, max_verifying = excluded.max_verifying,
           max_cost_per_day = excluded.max_cost_per_day, weight = excluded.weight,
           updated_at = excluded.updated_at, updated_by = excluded.updated_by;
    -- the cap split among the key's shards (limits.sql), the remainder to the first
    INSERT INTO ledger.limit_shard (key, shard) SELECT p_key, s FROM generate_series(0, 7) s
    ON CONFLICT DO NOTHING;
    INSERT INTO ledger.limit_given (key, shard, lane)
    SELECT p_key, s, l FROM generate_series(0, 7) s, generate_series(0, 7) l
    ON CONFLICT DO NOTHING;
    UPDATE ledger.limit_shard s
       SET max_leased = CASE WHEN p_max_leased IS NULL THEN NULL
                             ELSE p_max_leased / 8 + (s.shard < p_max_leased % 8)::integer END
     WHERE s.key = p_key;
    IF v_before.key IS NULL OR (v_before.max_leased, v_before.max_verifying, v_before.max_cost_per_day,
                                v_before.weight)
                               IS DISTINCT FROM (p_max_leased, p_max_verifying, p_max_cost_per_day, p_weight) THEN
        PERFORM ledger.limit_journal('limit.set', p_key, p_operator, 'operator',
                    jsonb_build_object('max_leased', p_max_leased, 'max_verifying', p_max_verifying,
                                       'max_cost_per_day', p_max_cost_per_day, 'weight', p_weight,
                                       'before', CASE WHEN v_before.key IS NULL THEN NULL ELSE
                                           jsonb_build_object('max_leased', v_before.max_leased,
                                                              'max_verifying', v_before.max_verifying,
                                                              'max_cost_per_day', v_before.max_cost_per_day,
                                                              'weight', v_before.weight) END));
        PERFORM pg_notify('ledger_ready', '0');  -- a raised cap may free waiting campaigns
    END IF;
END
$$;

-- A named resource's rates, set live (NULL: that rate is not limited).
-- Journaled with the operator; a bucket set again keeps its state.
CREATE OR REPLACE FUNCTION ledger_api.set_bucket(
        p_resource text, p_requests_per_minute double precision DEFAULT NULL,
        p_tokens_per_minute double precision DEFAULT NULL, p_operator text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_before ledger.limit_bucket;
BEGIN
    IF p_resource IS NULL OR p_resource !~ '^[a-z0-9][a-z0-9_.-]{0,62}$' THEN
        RAISE EXCEPTION 'a resource is named like a class (lowercase letters, digits, _ . -, 1 to 63), not %',
            coalesce(quote_literal(p_resource), 'NULL') USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('requests_per_minute', p_requests_per_minute, 0.001, 1000000, true);
    PERFORM ledger.check_range('tokens_per_minute', p_tokens_per_minute, 1, 10000000000, true);
    PERFORM ledger.check_length('operator', coalesce(p_operator, 'operator'), 1, 200);
    SELECT * INTO v_before FROM ledger.limit_bucket b WHERE b.resource = p_resource;
    -- one shard below 600 requests a minute, at most 8 above (limits.sql)
    INSERT INTO ledger.limit_bucket AS b (resource, requests_per_minute, tokens_per_minute, shards,
                                          updated_at, updated_by)
    VALUES (p_resource, p_requests_per_minute, p_tokens_per_minute,
            least(8, greatest(1, floor(coalesce(p_requests_per_minute, 0) / 600)))::smallint, ledger.now(),
            coalesce(p_operator, 'operator'))
    ON CONFLICT (resource) DO UPDATE
       SET requests_per_minute = excluded.requests_per_minute,
           tokens_per_minute = excluded.tokens_per_minute, shards = excluded.shards,
           -- a lifted rate owes nothing
           token_tat = CASE WHEN excluded.tokens_per_minute IS NULL THEN '-infinity' ELSE b.token_tat END,
           updated_at = excluded.updated_at, updated_by = excluded.updated_by;
    INSERT INTO ledger.limit_bucket_shard (resource, shard) SELECT p_resource, s FROM generate_series(0, 7) s
    ON CONFLICT DO NOTHING;
    IF p_requests_per_minute IS NULL THEN
        UPDATE ledger.limit_bucket_shard s SET request_tat = '-infinity' WHERE s.resource = p_resource;
    END IF;
    IF v_before.resource IS NULL
       OR (v_before.requests_per_minute, v_before.tokens_per_minute)
          IS DISTINCT FROM (p_requests_per_minute, p_tokens_per_minute) THEN
        PERFORM ledger.limit_journal('bucket.set', p_resource, p_operator, 'operator',
                    jsonb_build_object('requests_per_minute', p_requests_per_minute,
                                       'tokens_per_minute', p_tokens_per_minute,
                                       'before', CASE WHEN v_before.resource IS NULL THEN NULL ELSE
                                           jsonb_build_object('requests_per_minute', v_before.requests_per_minute,
                                                              'tokens_per_minute', v_before.tokens_per_minute) END));
    END IF;
END
$$;

-- A class's limits (ledger classes sync): the key templates its campaigns
-- are counted under, the resources its attempts use, each campaign's
-- budget. Campaigns still open take the new keys and resources at once
-- (the counters follow: limits.sql), and the new budget unless an operator
-- gave one its own. Journaled when anything changed.
CREATE OR REPLACE FUNCTION ledger_api.set_class_limits(
        p_class text, p_limit_keys text[] DEFAULT '{}', p_resources text[] DEFAULT '{}',
        p_max_cost double precision DEFAULT NULL, p_operator text DEFAULT NULL,
        p_fair_key text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_class ledger.campaign_class;
    v_keys text[] := coalesce(p_limit_keys, '{}');
    v_resources text[] := coalesce(p_resources, '{}');
    v_c record;
    v_new text[];
BEGIN
    SELECT * INTO v_class FROM ledger.campaign_class cc WHERE cc.name = p_class FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign class % is not registered (run: ledger classes sync)', p_class
            USING ERRCODE = 'LG004';
    END IF;
    IF cardinality(v_keys) > 16 OR EXISTS (
           SELECT 1 FROM unnest(v_keys) t
            WHERE t IS NULL OR NOT (t ~ '^[a-z][a-z0-9_.-]{0,31}$'
                                    OR t ~ '^[a-z][a-z0-9_.-]{0,31}:[^[:space:]]{1,200}$')) THEN
        RAISE EXCEPTION 'limit_keys are at most 16 of: class, repo, a label name (tenant), or a key (team:infra)'
            USING ERRCODE = 'LG007';
    END IF;
    IF cardinality(v_resources) > 8 OR EXISTS (
           SELECT 1 FROM unnest(v_resources) r WHERE r IS NULL OR r !~ '^[a-z0-9][a-z0-9_.-]{0,62}$') THEN
        RAISE EXCEPTION 'resources are at most 8 names (lowercase letters, digits, _ . -)'
            USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('max_cost', p_max_cost, 0.000001, 1000000000, true);
    IF p_fair_key IS NOT NULL AND p_fair_key !~ '^[a-z][a-z0-9_.-]{0,31}$' THEN
        RAISE EXCEPTION 'fair_key is the name of a key template (class, repo, or a label name such as tenant)'
            USING ERRCODE = 'LG007';
    END IF;
    IF p_fair_key IS NOT NULL AND NOT p_fair_key = ANY (v_keys) THEN
        v_keys := v_keys || p_fair_key;  -- counted, so that its leases order the keys
    END IF;
    IF (v_class.limit_keys, v_class.resources, v_class.max_cost, v_class.fair_key)
       IS NOT DISTINCT FROM (v_keys, v_resources, p_max_cost, p_fair_key) THEN
        RETURN;
    END IF;
    UPDATE ledger.campaign_class cc
       SET limit_keys = v_keys, resources = v_resources, max_cost = p_max_cost, fair_key = p_fair_key,
           updated_at = ledger.now()
     WHERE cc.name = p_class;
    FOR v_c IN SELECT c.id, c.target, c.labels, c.max_cost FROM ledger.campaign c
                WHERE c.class = p_class AND c.state NOT IN ('confirmed', 'dismissed', 'abandoned')
                ORDER BY c.id FOR NO KEY UPDATE LOOP
        v_new := ledger.resolve_limit_keys(v_keys, p_class, v_c.target, v_c.labels);
        IF p_fair_key IS NOT NULL THEN
            v_new := ARRAY(SELECT DISTINCT k FROM unnest(v_new || ledger.resolve_fair_key(
                               p_fair_key, p_class, v_c.target, v_c.labels)) k ORDER BY k);
        END IF;
        PERFORM ledger.ensure_limit_keys(v_new);
        UPDATE ledger.campaign c
           SET limit_keys = v_new, resources = v_resources,
               fair_key = ledger.resolve_fair_key(p_fair_key, p_class, v_c.target, v_c.labels),
               max_cost = CASE WHEN c.max_cost IS NOT DISTINCT FROM v_class.max_cost THEN p_max_cost
                               ELSE c.max_cost END
         WHERE c.id = v_c.id;
    END LOOP;
    PERFORM ledger.limit_journal('class.limits_set', 'class:' || p_class, p_operator, 'operator',
                jsonb_build_object('limit_keys', to_jsonb(v_keys), 'resources', to_jsonb(v_resources),
                                   'max_cost', p_max_cost, 'fair_key', p_fair_key,
                                   'before', jsonb_build_object('limit_keys', to_jsonb(v_class.limit_keys),
                                                                'resources', to_jsonb(v_class.resources),
                                                                'max_cost', v_class.max_cost)));
END
$$;

-- An operator raises a campaign's budget: max_cost becomes p_max_cost
-- (above what it spent, or LG007 says by how much); a budget_exhausted
-- campaign goes back to ready (raise_budget), any other open one just
-- keeps the new figure. Journaled with the operator and the figures.
CREATE OR REPLACE FUNCTION ledger_api.raise_budget(p_campaign_id bigint, p_max_cost double precision,
                                                   p_operator text DEFAULT NULL,
                                                   p_reason text DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_c ledger.campaign;
    v_detail jsonb;
BEGIN
    IF p_campaign_id IS NULL THEN
        RAISE EXCEPTION 'a campaign id is required' USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('max_cost', p_max_cost, 0.000001, 1000000000);
    PERFORM ledger.check_length('operator', coalesce(p_operator, 'operator'), 1, 200);
    IF p_reason IS NOT NULL THEN
        PERFORM ledger.check_length('reason', p_reason, 1, 4000);
    END IF;
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign % does not exist', p_campaign_id USING ERRCODE = 'LG004';
    END IF;
    IF v_c.state IN ('confirmed', 'dismissed', 'abandoned') THEN
        RAISE EXCEPTION 'campaign % is %: its budget is closed', p_campaign_id, v_c.state
            USING ERRCODE = 'LG002';
    END IF;
    IF p_max_cost <= v_c.cost_spent THEN
        RAISE EXCEPTION 'campaign % has spent %: a budget of % would leave nothing (raise it above %)',
            p_campaign_id, v_c.cost_spent, p_max_cost, v_c.cost_spent USING ERRCODE = 'LG007';
    END IF;
    v_detail := jsonb_build_object('max_cost', p_max_cost, 'was', v_c.max_cost,
                                   'cost_spent', v_c.cost_spent, 'reason', p_reason);
    IF v_c.state = 'budget_exhausted' THEN
        PERFORM ledger.begin_transition('raise_budget', 'operator', coalesce(p_operator, 'operator'), v_detail);
        UPDATE ledger.campaign c SET state = 'ready', max_cost = p_max_cost, next_attempt_at = ledger.now()
         WHERE c.id = p_campaign_id;
        PERFORM ledger.end_transition();
    ELSE
        UPDATE ledger.campaign c SET max_cost = p_max_cost WHERE c.id = p_campaign_id;
        PERFORM ledger.append_event(p_campaign_id, 'budget.raised', coalesce(p_operator, 'operator'), v_detail);
    END IF;
    PERFORM ledger.limit_journal('budget.raised', 'campaign:' || p_campaign_id, p_operator, 'operator', v_detail);
    RETURN CASE WHEN v_c.state = 'budget_exhausted' THEN 'ready' ELSE v_c.state END;
END
$$;
