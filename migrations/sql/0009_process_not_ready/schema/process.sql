-- The registry of live processes: who is running, what each holds, last seen
--
-- Every service process (worker, reaper, verifier, dispatcher, sensors, the
-- journal trimmer) keeps one row per service it runs, refreshed on its own
-- tick through its role's report function below: which role, on which host,
-- which pid, since when, the identity it writes on leases and verdicts, how
-- often it reports, and what it holds now (campaigns, verifications, side
-- effects: a JSON array it keeps current). A row is only what its process
-- says of itself, for the operator's workers view: nothing is fenced by it
-- (leases are). A process that stops reporting shows as gone once three of
-- its intervals have passed (ledger_api.processes); one that stopped cleanly
-- says so; rows not seen for a day are removed when a new process registers.
-- A process that cannot start for a reason of its host or its configuration
-- (no sandbox, a bad ledger.toml, a repository that is not there) reports
-- while it waits, with that reason in not_ready (ledger.runtime.startup);
-- NULL: it works.

CREATE TABLE IF NOT EXISTS ledger.process (
    role        text NOT NULL CHECK (role IN ('sensor', 'worker', 'reaper', 'verifier',
                                              'dispatcher', 'operator')),
    host        text NOT NULL CHECK (length(host) BETWEEN 1 AND 255),
    pid         integer NOT NULL CHECK (pid > 0),
    started_at  timestamptz NOT NULL,
    -- what it writes on leases, verdicts, intents (ledger.identity)
    identity    text NOT NULL CHECK (length(identity) BETWEEN 1 AND 200),
    service     text NOT NULL CHECK (service ~ '^[a-z][a-z0-9_-]{0,39}$'),
    interval_s  double precision NOT NULL CHECK (interval_s > 0 AND interval_s <= 3600),
    -- [{"kind": "campaign", "id": 12, "since": "...", ...}, ...]
    holds       jsonb NOT NULL DEFAULT '[]'
                CHECK (jsonb_typeof(holds) = 'array' AND ledger.json_within(holds, 3, 65536)),
    last_seen   timestamptz NOT NULL,
    stopped_at  timestamptz,
    -- why it is not working yet (one line: the cause and the fix); NULL: it works
    not_ready   text CHECK (length(not_ready) BETWEEN 1 AND 1000),
    PRIMARY KEY (role, host, pid, started_at)
);
CREATE INDEX IF NOT EXISTS process_by_last_seen ON ledger.process (last_seen);

-- One report of a process (its first registers it). Returns when it was seen.
CREATE OR REPLACE FUNCTION ledger.report_process(
        p_role text, p_host text, p_pid integer, p_started_at timestamptz, p_identity text,
        p_service text, p_interval_s double precision, p_holds jsonb, p_stopping boolean,
        p_not_ready text)
    RETURNS timestamptz
    LANGUAGE plpgsql
AS $$
DECLARE
    v_now timestamptz := ledger.now();
    v_new boolean;
BEGIN
    PERFORM ledger.check_length('host', p_host, 1, 255);
    PERFORM ledger.check_length('identity', p_identity, 1, 200);
    PERFORM ledger.check_range('pid', p_pid, 1, 2147483647);
    PERFORM ledger.check_range('interval_s', p_interval_s, 0.001, 3600);
    IF p_not_ready IS NOT NULL THEN
        PERFORM ledger.check_length('not_ready', p_not_ready, 1, 1000);
    END IF;
    IF p_started_at IS NULL OR p_started_at > v_now + interval '1 minute' THEN
        RAISE EXCEPTION 'a process reports when it started (not in the future)' USING ERRCODE = 'LG007';
    END IF;
    IF p_service IS NULL OR p_service !~ '^[a-z][a-z0-9_-]{0,39}$' THEN
        RAISE EXCEPTION 'a service name is 1 to 40 of [a-z0-9_-], starting with a letter'
            USING ERRCODE = 'LG007';
    END IF;
    IF jsonb_typeof(coalesce(p_holds, '[]')) <> 'array'
       OR NOT ledger.json_within(coalesce(p_holds, '[]'), 3, 65536) THEN
        RAISE EXCEPTION 'what a process holds is a JSON array (at most 64 KiB, 3 levels)'
            USING ERRCODE = 'LG007';
    END IF;
    INSERT INTO ledger.process AS p (role, host, pid, started_at, identity, service, interval_s,
                                     holds, last_seen, stopped_at, not_ready)
    VALUES (p_role, p_host, p_pid, p_started_at, p_identity, p_service, p_interval_s,
            coalesce(p_holds, '[]'), v_now, CASE WHEN p_stopping THEN v_now END, p_not_ready)
    ON CONFLICT (role, host, pid, started_at) DO UPDATE
       SET identity = excluded.identity, service = excluded.service,
           interval_s = excluded.interval_s, holds = excluded.holds, last_seen = v_now,
           stopped_at = excluded.stopped_at, not_ready = excluded.not_ready
    RETURNING (xmax = 0) INTO v_new;
    IF v_new THEN
        DELETE FROM ledger.process p WHERE p.last_seen < v_now - interval '1 day';
    END IF;
    RETURN v_now;
END
$$;

-- One report function per role, so that each is granted to exactly one role
-- (grants.sql) and a process can only ever report as the role it acts as.
CREATE OR REPLACE FUNCTION ledger_api.report_sensor_process(
        p_host text, p_pid integer, p_started_at timestamptz, p_identity text, p_service text,
        p_interval_s double precision, p_holds jsonb DEFAULT '[]', p_stopping boolean DEFAULT false,
        p_not_ready text DEFAULT NULL)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN ledger.report_process('sensor', p_host, p_pid, p_started_at, p_identity, p_service,
                                 p_interval_s, p_holds, coalesce(p_stopping, false),
                                 p_not_ready);
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.report_worker_process(
        p_host text, p_pid integer, p_started_at timestamptz, p_identity text, p_service text,
        p_interval_s double precision, p_holds jsonb DEFAULT '[]', p_stopping boolean DEFAULT false,
        p_not_ready text DEFAULT NULL)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN ledger.report_process('worker', p_host, p_pid, p_started_at, p_identity, p_service,
                                 p_interval_s, p_holds, coalesce(p_stopping, false),
                                 p_not_ready);
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.report_reaper_process(
        p_host text, p_pid integer, p_started_at timestamptz, p_identity text, p_service text,
        p_interval_s double precision, p_holds jsonb DEFAULT '[]', p_stopping boolean DEFAULT false,
        p_not_ready text DEFAULT NULL)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN ledger.report_process('reaper', p_host, p_pid, p_started_at, p_identity, p_service,
                                 p_interval_s, p_holds, coalesce(p_stopping, false),
                                 p_not_ready);
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.report_verifier_process(
        p_host text, p_pid integer, p_started_at timestamptz, p_identity text, p_service text,
        p_interval_s double precision, p_holds jsonb DEFAULT '[]', p_stopping boolean DEFAULT false,
        p_not_ready text DEFAULT NULL)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN ledger.report_process('verifier', p_host, p_pid, p_started_at, p_identity, p_service,
                                 p_interval_s, p_holds, coalesce(p_stopping, false),
                                 p_not_ready);
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.report_dispatcher_process(
        p_host text, p_pid integer, p_started_at timestamptz, p_identity text, p_service text,
        p_interval_s double precision, p_holds jsonb DEFAULT '[]', p_stopping boolean DEFAULT false,
        p_not_ready text DEFAULT NULL)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN ledger.report_process('dispatcher', p_host, p_pid, p_started_at, p_identity, p_service,
                                 p_interval_s, p_holds, coalesce(p_stopping, false),
                                 p_not_ready);
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.report_operator_process(
        p_host text, p_pid integer, p_started_at timestamptz, p_identity text, p_service text,
        p_interval_s double precision, p_holds jsonb DEFAULT '[]', p_stopping boolean DEFAULT false,
        p_not_ready text DEFAULT NULL)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN ledger.report_process('operator', p_host, p_pid, p_started_at, p_identity, p_service,
                                 p_interval_s, p_holds, coalesce(p_stopping, false),
                                 p_not_ready);
END
$$;
