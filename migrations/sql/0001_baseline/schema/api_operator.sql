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

-- Register or update a campaign class (what the kernel judges: budget, lease,
-- backoff, authority, promotion target). Every number is range-checked here,
-- with the argument's name, before anything is written.
CREATE OR REPLACE FUNCTION ledger_api.register_class(
        p_name text, p_max_attempts integer DEFAULT 3, p_lease_seconds double precision DEFAULT 60,
        p_backoff_base_s double precision DEFAULT 5, p_backoff_factor double precision DEFAULT 2,
        p_backoff_cap_s double precision DEFAULT 600, p_backoff_jitter double precision DEFAULT 0.1,
        p_seat_policy text DEFAULT 'none', p_authority jsonb DEFAULT '{}',
        p_acceptance jsonb DEFAULT '{}', p_promotion jsonb DEFAULT '{}',
        p_verifier text DEFAULT 'command', p_weight integer DEFAULT 1)
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
    INSERT INTO ledger.campaign_class AS cc
           (name, max_attempts, lease_seconds, backoff_base_s, backoff_factor, backoff_cap_s,
            backoff_jitter, seat_policy, authority, acceptance, promotion, verifier, weight,
            created_at, updated_at)
    VALUES (p_name, p_max_attempts, p_lease_seconds, p_backoff_base_s, p_backoff_factor,
            p_backoff_cap_s, p_backoff_jitter, p_seat_policy, coalesce(p_authority, '{}'),
            coalesce(p_acceptance, '{}'), coalesce(p_promotion, '{}'), p_verifier, p_weight, v_now, v_now)
    ON CONFLICT (name) DO UPDATE
       SET max_attempts = excluded.max_attempts, lease_seconds = excluded.lease_seconds,
           backoff_base_s = excluded.backoff_base_s, backoff_factor = excluded.backoff_factor,
           backoff_cap_s = excluded.backoff_cap_s, backoff_jitter = excluded.backoff_jitter,
           seat_policy = excluded.seat_policy, authority = excluded.authority,
           acceptance = excluded.acceptance, promotion = excluded.promotion,
           verifier = excluded.verifier, weight = excluded.weight, updated_at = v_now;
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
