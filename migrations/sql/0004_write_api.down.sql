-- 0004 down: drop the write API and its helpers.
DO $$
DECLARE
    f record;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure AS fn
          FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = 'ledger_api'
            OR (n.nspname = 'ledger' AND p.proname IN (
                    'raise_stale', 'backoff', 'append_event', 'exhaust_if_spent', 'authorized',
                    'open_campaign', 'current_verification'))
    LOOP
        EXECUTE format('DROP FUNCTION %s', f.fn);
    END LOOP;
END
$$;
