-- 0007 down: batch calls gone, the state foreign key and the pinned helpers back.
DROP FUNCTION IF EXISTS ledger_api.record_attempts(jsonb);
DROP FUNCTION IF EXISTS ledger_api.claim_campaigns(text, text[], integer);

ALTER TABLE ledger.campaign DROP CONSTRAINT IF EXISTS campaign_state_known;
ALTER TABLE ledger.campaign ADD CONSTRAINT campaign_state_fkey
    FOREIGN KEY (state) REFERENCES ledger.state (name);

ALTER FUNCTION ledger.campaign_guard() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION ledger.campaign_journal() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION ledger.journal_notify() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION ledger.attempt_guard() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION ledger.append_event(bigint, text, text, jsonb, boolean) SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION ledger.begin_transition(p_name text, p_role text, p_actor text,
                                                   p_detail jsonb DEFAULT '{}')
    RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM set_config('ledger.transition', p_name, true);
    PERFORM set_config('ledger.actor_role', p_role, true);
    PERFORM set_config('ledger.actor', coalesce(p_actor, p_role), true);
    PERFORM set_config('ledger.detail', coalesce(p_detail, '{}')::text, true);
END
$$;

CREATE OR REPLACE FUNCTION ledger.end_transition() RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM set_config('ledger.transition', '', true);
    PERFORM set_config('ledger.actor_role', '', true);
    PERFORM set_config('ledger.detail', '', true);
END
$$;

CREATE OR REPLACE FUNCTION ledger.now() RETURNS timestamptz
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    pinned text := current_setting('ledger.now', true);
BEGIN
    IF pinned IS NOT NULL AND pinned <> ''
       AND (SELECT value = 'true' FROM ledger.meta WHERE key = 'clock_pinnable') THEN
        RETURN pinned::timestamptz;
    END IF;
    RETURN statement_timestamp();
END
$$;

DROP FUNCTION IF EXISTS ledger.pinned_now(text);
