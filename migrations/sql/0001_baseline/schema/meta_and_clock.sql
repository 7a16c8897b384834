-- The schemas' settings and the clock
--
-- Runs as the owner (as every file but roles.sql does). The schemas themselves
-- are created by roles.sql; their privileges for runtime roles are in
-- grants.sql.
--
-- Like every schema file, this one may be applied again to a database that
-- has it (CONTRIBUTING.md, "Working on the schema"): tables and indexes are
-- created IF NOT EXISTS, rows inserted ON CONFLICT DO NOTHING, functions,
-- triggers and views created OR REPLACE.

COMMENT ON SCHEMA ledger IS 'Ledger tables and internal functions; owner-only.';
REVOKE ALL ON SCHEMA ledger FROM PUBLIC;
COMMENT ON SCHEMA ledger_api IS 'The narrow API: SECURITY DEFINER functions and read views.';
REVOKE ALL ON SCHEMA ledger_api FROM PUBLIC;

-- Settings of this installation (the role prefix, whether the clock may be pinned).
CREATE TABLE IF NOT EXISTS ledger.meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO ledger.meta (key, value) VALUES
    ('role_prefix', current_setting('ledger.role_prefix')),
    ('clock_pinnable', 'false')
ON CONFLICT (key) DO NOTHING;

-- The role that plays an actor ('worker' -> 'ledger_worker').
CREATE OR REPLACE FUNCTION ledger.role_name(actor text) RETURNS text
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT value || actor FROM ledger.meta WHERE key = 'role_prefix'
$$;

-- Every timestamp written or compared in SQL comes from ledger.now(). A test
-- may pin it with SET LOCAL ledger.now = '...', but only in a database where
-- the owner has allowed that (ledger.meta clock_pinnable); in production a
-- worker cannot move the clock that judges its own lease.
--
-- The clock is called several times per write, so it is an inlinable SQL
-- expression without a function-level SET search_path (each call of a
-- function with one pushes and pops a setting and invalidates the cached
-- search path); it names everything schema-qualified instead. The
-- pinnable-clock check lives in pinned_now, which only runs when a pin is set.
CREATE OR REPLACE FUNCTION ledger.pinned_now(p_pinned text) RETURNS timestamptz
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF (SELECT value = 'true' FROM ledger.meta WHERE key = 'clock_pinnable') THEN
        RETURN p_pinned::timestamptz;
    END IF;
    RETURN statement_timestamp();
END
$$;

CREATE OR REPLACE FUNCTION ledger.now() RETURNS timestamptz
    LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN COALESCE(pg_catalog.current_setting('ledger.now', true), '') = ''
                THEN pg_catalog.statement_timestamp()
                ELSE ledger.pinned_now(pg_catalog.current_setting('ledger.now', true)) END
$$;

-- Runtime roles get no CREATE anywhere and no temporary objects: a shadowing
-- object has nowhere to live. Database-level privileges are not copied by
-- CREATE DATABASE ... TEMPLATE, so `ledger migrate` runs this every time, not
-- only in the baseline. Run by the administrator (SECURITY INVOKER).
CREATE OR REPLACE FUNCTION ledger.secure_database() RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = 'public') THEN
        REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    END IF;
END
$$;
