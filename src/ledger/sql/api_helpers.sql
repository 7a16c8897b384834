-- Internal helpers the role APIs share
--
-- Schema ledger: not executable by runtime roles (grants.sql). Errors carry
-- Ledger's own SQLSTATEs (src/ledger/errors.py has the table):
--   LG001 stale lease     LG002 illegal transition   LG003 forbidden
--   LG004 not found       LG005 duplicate objective  LG006 repeated approach
--   LG007 invalid input   LG008 same identity        LG009 immutable record
--   LG010 idempotency key reused with another request

-- Raise the right error for a write whose (campaign, generation) did not match.
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
