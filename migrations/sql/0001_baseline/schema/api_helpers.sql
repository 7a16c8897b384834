-- Internal helpers the role APIs share
--
-- Schema ledger: not executable by runtime roles (grants.sql). Errors carry
-- Ledger's own SQLSTATEs (src/ledger/errors.py has the table):
--   LG001 stale lease     LG002 illegal transition   LG003 forbidden
--   LG004 not found       LG005 duplicate objective  LG006 repeated approach
--   LG007 invalid input   LG008 same identity        LG009 immutable record
--   LG010 idempotency key reused with another request

-- A numeric argument within [p_min, p_max]; NaN and the infinities are out
-- of every range (NaN compares greater than every number in PostgreSQL).
CREATE OR REPLACE FUNCTION ledger.check_range(p_name text, p_value double precision,
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
CREATE OR REPLACE FUNCTION ledger.check_lease_args(p_campaign_id bigint, p_generation bigint)
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

-- The campaign a lease names, locked. Callers with an idempotent ending look
-- at what the lease already wrote (after the lock, so a first try that
-- committed meanwhile is seen) before they test it with ledger.check_live.
CREATE OR REPLACE FUNCTION ledger.lease_row(p_campaign_id bigint, p_generation bigint)
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
CREATE OR REPLACE FUNCTION ledger.check_live(p_c ledger.campaign, p_generation bigint)
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
CREATE OR REPLACE FUNCTION ledger.fence(p_campaign_id bigint, p_generation bigint)
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

-- Delay before the next attempt after n failures: base * factor^(n-1), capped,
-- with +/- jitter so a fleet does not retry in lockstep.
CREATE OR REPLACE FUNCTION ledger.backoff(p_class text, p_failures integer) RETURNS interval
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT make_interval(secs => greatest(0,
               least(cc.backoff_cap_s,
                     cc.backoff_base_s * power(cc.backoff_factor, greatest(p_failures - 1, 0)))
               * (1 + cc.backoff_jitter * (2 * random() - 1))))
      FROM ledger.campaign_class cc WHERE cc.name = p_class
$$;

-- A campaign back in ready with its attempts used up goes to exhausted.
CREATE OR REPLACE FUNCTION ledger.exhaust_if_spent(p_campaign_id bigint) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_rows integer;
BEGIN
    PERFORM ledger.begin_transition('exhaust', 'system', 'system',
                                    jsonb_build_object('reason', 'attempts used up'));
    UPDATE ledger.campaign c SET state = 'exhausted'
     WHERE c.id = p_campaign_id AND c.state = 'ready' AND c.attempt_count >= c.max_attempts;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    PERFORM ledger.end_transition();
    RETURN v_rows > 0;
END
$$;

-- Does a class's authority profile let `p_role` touch `p_target` with `p_kind`?
-- Profiles list glob patterns ('*' matches anything): refs for git, hosts for http.
CREATE OR REPLACE FUNCTION ledger.authorized(p_authority jsonb, p_role text, p_kind text, p_target text)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (
        SELECT 1
          FROM jsonb_array_elements_text(
                   coalesce(p_authority -> p_role -> CASE p_kind WHEN 'git.update_ref' THEN 'refs'
                                                                 WHEN 'http.request' THEN 'hosts' END,
                            '[]')) AS pattern
         WHERE CASE p_kind
                   WHEN 'git.update_ref' THEN p_target
                   ELSE substring(p_target FROM '^[a-z]+://([^/:?#]+)')
               END
               LIKE replace(replace(replace(replace(pattern, '\', '\\'), '%', '\%'), '_', '\_'),
                            '*', '%'))
$$;

-- Which intents of generation p_generation may still be carried out: those
-- whose attempt is still in play or succeeded.
CREATE OR REPLACE FUNCTION ledger.generation_live(p_c ledger.campaign, p_generation bigint)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE
AS $$
    SELECT p_c.generation = p_generation
       AND p_c.state IN ('leased', 'attempted', 'verified', 'confirmed')
$$;

-- The state an ending of generation p_generation left its campaign in,
-- from the journal: the transition's `to`, or exhausted if the next event
-- exhausted it. (For an identical retry of that ending.)
CREATE OR REPLACE FUNCTION ledger.ended_as(p_campaign_id bigint, p_generation bigint, p_transition text)
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
