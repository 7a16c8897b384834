-- 0008 operator surface
--
-- * Every journal event records the role that acted (campaign_event.actor_role).
--   The autonomy report decides "a human did this" by that role -- an
--   operator's call, from the API, the dashboard or the CLI -- never by the
--   actor's name: a sensor token posting through the HTTP API is named
--   http:<token> and is still automation.
--   The column's default reads ledger.actor_role, which begin_transition sets
--   for every state change (and the guard trigger holds it to the
--   transition's owner), so the journal trigger's events carry it with no
--   body changing. Non-transition events carry it where the writer knows it:
--   append_events (the worker's journal) and retry_now (an operator's) below.
--   Events appended by ledger.append_event for verifiers and dispatchers stay
--   NULL: none of them is an operator's.
--   (No foreign key to ledger.actor: 0007 removed one from campaign.state for
--   the row lock it took per write.)
-- * retry_now(campaign, operator): an operator skips the rest of a ready
--   campaign's backoff. Not a state change (ready stays ready), so not a
--   transition: a journaled operator event that moves next_attempt_at to now,
--   refused unless the campaign is ready and still waiting.

ALTER TABLE ledger.campaign_event
    ADD COLUMN actor_role text
        DEFAULT nullif(pg_catalog.current_setting('ledger.actor_role', true), '');
CREATE OR REPLACE VIEW ledger_api.events AS
SELECT campaign_id, seq, type, actor, generation, delta, payload, created_at, actor_role
  FROM ledger.campaign_event;

CREATE FUNCTION ledger_api.retry_now(p_campaign_id bigint, p_operator text DEFAULT NULL)
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
REVOKE ALL ON FUNCTION ledger_api.retry_now(bigint, text) FROM PUBLIC;

DO $$
BEGIN
    EXECUTE format('GRANT EXECUTE ON FUNCTION ledger_api.retry_now(bigint, text) TO %I',
                   ledger.role_name('operator'));
END
$$;

-- As in 0004, and the worker's role on what it journals.
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
        INSERT INTO ledger.campaign_event (campaign_id, seq, type, actor, generation, delta, payload,
                                           created_at, actor_role)
        SELECT p_campaign_id, head.event_seq - v_n + e.ord, e.value ->> 'type', head.lease_owner,
               head.generation, coalesce((e.value ->> 'delta')::boolean, false),
               coalesce(e.value -> 'payload', '{}'), ledger.now(), 'worker'
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
