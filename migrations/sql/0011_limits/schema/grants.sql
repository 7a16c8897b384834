-- Grants: who may do what, in one place
--
-- Runtime roles hold no privilege on a table. They read ledger_api's views
-- (through the reader role, which every runtime role is a member of) and call
-- ledger_api's SECURITY DEFINER functions, each granted to exactly one role by
-- the table below (the greeting, ledger_api.hello, to the reader role: so to
-- every role). Nothing in schema ledger is theirs to call. This file is
-- applied last, and again by any revision that adds or changes a function:
-- it ends with ledger.check_privileges(), which fails the migration if any
-- function escaped this table.

-- Functions are executable by PUBLIC unless revoked, and a per-schema
-- ALTER DEFAULT PRIVILEGES cannot revoke that global default: revoke it for
-- everything the owner creates (this file runs as the owner), then from every
-- function that exists already.
ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA ledger, ledger_api FROM PUBLIC;

-- Each ledger_api function to exactly the role that owns it. A grant moves
-- with the table: every runtime role loses EXECUTE first.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT x.name, p.oid::regprocedure AS fn, x.actor
          FROM (VALUES
                -- sensor (api_sensor.sql)
                ('open_campaign', 'sensor'), ('record_observation', 'sensor'),
                ('claim_sensor_tick', 'sensor'), ('register_sensor', 'sensor'),
                -- worker (api_worker.sql)
                ('claim_campaign', 'worker'), ('claim_campaigns', 'worker'), ('heartbeat', 'worker'),
                ('record_attempt', 'worker'), ('record_attempts', 'worker'), ('fail_attempt', 'worker'),
                ('append_events', 'worker'), ('request_side_effect', 'worker'),
                ('refuse_candidate', 'worker'), ('release_attempt', 'worker'),
                ('report_security_event', 'worker'), ('reobserve', 'worker'),
                -- reaper (api_reaper.sql)
                ('expire_leases', 'reaper'), ('expire_approvals', 'reaper'),
                -- verifier (api_verifier.sql)
                ('claim_verification', 'verifier'), ('heartbeat_verification', 'verifier'),
                ('accept', 'verifier'), ('reject', 'verifier'), ('release_verification', 'verifier'),
                -- dispatcher (api_dispatcher.sql)
                ('claim_side_effect', 'dispatcher'), ('confirm_side_effect', 'dispatcher'),
                ('complete_side_effect', 'dispatcher'), ('rebase_promotion', 'dispatcher'),
                ('merge_queue_view', 'dispatcher'), ('merge_queue_stack', 'dispatcher'),
                ('merge_queue_freeze', 'dispatcher'), ('merge_queue_landed', 'dispatcher'),
                ('merge_queue_dissolve', 'dispatcher'),
                -- operator (api_operator.sql)
                ('abandon', 'operator'), ('reopen', 'operator'), ('retry_now', 'operator'),
                ('register_class', 'operator'), ('trim_journal', 'operator'),
                ('pause_class', 'operator'), ('resume_class', 'operator'),
                ('approve', 'operator'), ('deny', 'operator'),
                -- limits (api_operator.sql, api_worker.sql)
                ('set_limit', 'operator'), ('set_bucket', 'operator'),
                ('set_class_limits', 'operator'), ('raise_budget', 'operator'),
                ('report_usage', 'worker'),
                -- the registry of processes (process.sql): each role reports itself
                ('report_sensor_process', 'sensor'), ('report_worker_process', 'worker'),
                ('report_reaper_process', 'reaper'), ('report_verifier_process', 'verifier'),
                ('report_dispatcher_process', 'dispatcher'),
                ('report_operator_process', 'operator'),
                -- the HTTP server's sign-ins and bulk jobs, through the operator role
                ('start_web_session', 'operator'), ('web_session', 'operator'),
                ('end_web_sessions', 'operator'), ('start_bulk_job', 'operator'),
                ('record_bulk_item', 'operator'), ('finish_bulk_job', 'operator'),
                ('bulk_job', 'operator'), ('server_secret', 'operator'),
                -- every process's greeting (compatibility.sql): to the reader
                -- role, of which every runtime role is a member
                ('hello', 'reader')
               ) AS x(name, actor)
          LEFT JOIN (pg_catalog.pg_proc p
                     JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
                                                   AND n.nspname = 'ledger_api')
                 ON p.proname = x.name
    LOOP
        IF g.fn IS NULL THEN
            RAISE EXCEPTION 'grants.sql grants ledger_api.%, which does not exist', g.name
                USING ERRCODE = 'LG009';
        END IF;
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM %I, %I, %I, %I, %I, %I, %I', g.fn,
                       ledger.role_name('reader'), ledger.role_name('sensor'),
                       ledger.role_name('worker'), ledger.role_name('reaper'),
                       ledger.role_name('verifier'), ledger.role_name('dispatcher'),
                       ledger.role_name('operator'));
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', g.fn, ledger.role_name(g.actor));
    END LOOP;

    -- The read side: every view in ledger_api to the reader role.
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA ledger_api TO %I', ledger.role_name('reader'));
    EXECUTE format('GRANT USAGE ON SCHEMA ledger_api TO %I, %I, %I, %I, %I, %I, %I',
                   ledger.role_name('reader'), ledger.role_name('sensor'), ledger.role_name('worker'),
                   ledger.role_name('reaper'), ledger.role_name('verifier'),
                   ledger.role_name('dispatcher'), ledger.role_name('operator'));
END
$$;

-- The self-check. Run at the end of this file and after every migration
-- (ledger.migrations.finish): a function that nobody granted, that PUBLIC may
-- call, or that runs with its caller's search_path is a bug, and fails the
-- migration.
CREATE OR REPLACE FUNCTION ledger.check_privileges() RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    bad text;
BEGIN
    SELECT string_agg(format('%s: %s', f.problem, f.functions), '; ' ORDER BY f.problem) INTO bad
      FROM (SELECT x.problem, string_agg(x.fn, ', ' ORDER BY x.fn) AS functions
              FROM (SELECT p.oid::regprocedure::text AS fn,
                           CASE
                               -- proacl NULL is the default ACL, which lets PUBLIC execute
                               WHEN p.proacl IS NULL
                                    OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0)
                               THEN 'executable by PUBLIC'
                               WHEN n.nspname = 'ledger'
                                    AND EXISTS (SELECT 1 FROM aclexplode(p.proacl) a
                                                 WHERE a.grantee <> p.proowner)
                               THEN 'internal, yet executable by a role other than the owner'
                               WHEN n.nspname = 'ledger_api'
                                    AND coalesce((SELECT array_agg(pg_get_userbyid(a.grantee)::text)
                                                    FROM aclexplode(p.proacl) a
                                                   WHERE a.grantee <> p.proowner), '{}')
                                        NOT IN (SELECT ARRAY[ledger.role_name(r)]
                                                  FROM unnest(ARRAY['sensor', 'worker', 'reaper', 'verifier',
                                                                    'dispatcher', 'operator', 'reader']) r)
                               THEN 'not granted to exactly one runtime role'
                               WHEN n.nspname = 'ledger_api'
                                    AND (NOT p.prosecdef OR p.proconfig IS NULL
                                         OR NOT 'search_path=pg_catalog, pg_temp' = ANY (p.proconfig))
                               THEN 'not SECURITY DEFINER with a pinned search_path'
                           END AS problem
                      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                     WHERE n.nspname IN ('ledger', 'ledger_api')) x
             WHERE x.problem IS NOT NULL
             GROUP BY x.problem) f;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'privilege check failed: %', bad USING ERRCODE = 'LG009';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION ledger.check_privileges() FROM PUBLIC;

SELECT ledger.check_privileges();
