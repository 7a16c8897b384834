-- 0007 down: batch calls gone, the state foreign key and the pinned helpers back.
DROP FUNCTION IF EXISTS ledger_api.record_attempts(jsonb);
DROP FUNCTION IF EXISTS ledger_api.claim_campaigns(text, text[], integer);

ALTER TABLE ledger.campaign ADD CONSTRAINT campaign_state_fkey
    FOREIGN KEY (state) REFERENCES ledger.state (name);

ALTER FUNCTION ledger.campaign_guard() SET search_path = pg_catalog, pg_temp;
CREATE OR REPLACE FUNCTION ledger.campaign_journal() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_from text := CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END;
    v_detail jsonb := coalesce(nullif(current_setting('ledger.detail', true), '')::jsonb, '{}');
BEGIN
    INSERT INTO ledger.campaign_event (campaign_id, seq, type, actor, generation, payload, created_at)
    VALUES (NEW.id, NEW.event_seq, 'transition',
            coalesce(nullif(current_setting('ledger.actor', true), ''), 'system'),
            NEW.generation,
            v_detail || jsonb_build_object(
                'transition', current_setting('ledger.transition', true),
                'from', v_from, 'to', NEW.state,
                'attempt_count', NEW.attempt_count),
            ledger.now());
    IF NEW.state = 'ready' THEN
        PERFORM pg_notify('ledger_ready', NEW.id::text);
    ELSIF NEW.state = 'attempted' THEN
        PERFORM pg_notify('ledger_attempted', NEW.id::text);
    END IF;
    IF v_from = 'leased' AND NEW.state <> 'attempted' AND NEW.generation > OLD.generation THEN
        PERFORM pg_notify('ledger_cancel', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER campaign_event_notify ON ledger.campaign_event;
DROP FUNCTION ledger.journal_notify();
CREATE FUNCTION ledger.journal_notify() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('ledger_event', e.campaign_id::text)
       FROM (SELECT DISTINCT a.campaign_id FROM appended a
              WHERE NOT (a.type = 'transition' AND a.payload ->> 'to' = 'leased')) e;
    RETURN NULL;
END
$$;
CREATE TRIGGER campaign_event_notify AFTER INSERT ON ledger.campaign_event
    REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION ledger.journal_notify();
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
