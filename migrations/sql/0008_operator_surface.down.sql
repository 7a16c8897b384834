-- 0008 down: no retry_now, no acting role on journal events.
DROP FUNCTION IF EXISTS ledger_api.retry_now(bigint, text);

DO $$
BEGIN
    -- The view is made again by its owner (a dropped column cannot be replaced away).
    EXECUTE format('SET ROLE %I', ledger.role_name('owner'));
END
$$;
DROP VIEW ledger_api.events;
CREATE VIEW ledger_api.events AS
SELECT campaign_id, seq, type, actor, generation, delta, payload, created_at
  FROM ledger.campaign_event;
DO $$
BEGIN
    EXECUTE format('GRANT SELECT ON ledger_api.events TO %I', ledger.role_name('reader'));
END
$$;
RESET ROLE;
-- append_events back to its 0004 text (without the column).
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

ALTER TABLE ledger.campaign_event DROP COLUMN actor_role;
