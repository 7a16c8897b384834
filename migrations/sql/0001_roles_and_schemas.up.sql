-- 0001 roles and schemas
--
-- Run by an administrator (a superuser, or a role with CREATEROLE that owns the
-- database). The migration runner sets the session setting ledger.role_prefix
-- before this file runs; every role name below is that prefix plus a suffix.
--
-- Roles are cluster-wide and outlive any one database, so creating them must be
-- idempotent and must tolerate a concurrent migration of another database on
-- the same cluster.

DO $$
DECLARE
    prefix text := current_setting('ledger.role_prefix');
    suffix text;
BEGIN
    IF prefix !~ '^[a-z][a-z0-9_]{0,30}$' THEN
        RAISE EXCEPTION 'invalid role prefix %', prefix USING ERRCODE = 'LG007';
    END IF;
    -- owner: owns every object, cannot log in, is no superuser, bypasses no RLS.
    -- reaper: a capability role (expire_leases); worker processes are members.
    FOREACH suffix IN ARRAY ARRAY['owner', 'reader', 'sensor', 'worker', 'reaper',
                                  'verifier', 'dispatcher', 'operator'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = prefix || suffix) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE '
                               'NOREPLICATION NOBYPASSRLS INHERIT', prefix || suffix);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another migration created it a moment ago
            END;
        END IF;
    END LOOP;

    -- Memberships: every runtime role may read; workers may reap.
    FOREACH suffix IN ARRAY ARRAY['sensor', 'worker', 'verifier', 'dispatcher', 'operator'] LOOP
        IF NOT pg_catalog.pg_has_role(prefix || suffix, prefix || 'reader', 'MEMBER') THEN
            BEGIN
                EXECUTE format('GRANT %I TO %I', prefix || 'reader', prefix || suffix);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
    END LOOP;
    IF NOT pg_catalog.pg_has_role(prefix || 'worker', prefix || 'reaper', 'MEMBER') THEN
        BEGIN
            EXECUTE format('GRANT %I TO %I', prefix || 'reaper', prefix || 'worker');
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END IF;

    -- A non-superuser administrator must be able to SET ROLE to the owner (to
    -- create objects owned by it) and to the runtime roles (to act as them when
    -- no per-role login is configured).
    IF NOT (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
        FOREACH suffix IN ARRAY ARRAY['owner', 'reader', 'sensor', 'worker', 'reaper',
                                      'verifier', 'dispatcher', 'operator'] LOOP
            IF NOT pg_catalog.pg_has_role(current_user, prefix || suffix, 'MEMBER') THEN
                EXECUTE format('GRANT %I TO %I', prefix || suffix, current_user);
            END IF;
        END LOOP;
    END IF;

    -- The administrator creates the two schemas on the owner's behalf, so the
    -- owner needs no CREATE on the database; then the session acts as the owner.
    EXECUTE format('CREATE SCHEMA ledger AUTHORIZATION %I', prefix || 'owner');
    EXECUTE format('CREATE SCHEMA ledger_api AUTHORIZATION %I', prefix || 'owner');
    EXECUTE format('SET ROLE %I', prefix || 'owner');
END
$$;

-- From here on the session acts as the owner: everything created below is owned
-- by it. The runner resets the role when the migration ends.

COMMENT ON SCHEMA ledger IS 'Ledger tables and internal functions; owner-only.';
REVOKE ALL ON SCHEMA ledger FROM PUBLIC;
COMMENT ON SCHEMA ledger_api IS 'The narrow API: SECURITY DEFINER functions and read views.';
REVOKE ALL ON SCHEMA ledger_api FROM PUBLIC;

-- Functions are executable by PUBLIC unless revoked; make revoked the default.
ALTER DEFAULT PRIVILEGES IN SCHEMA ledger REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA ledger_api REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

-- Settings of this installation (the role prefix, whether the clock may be pinned).
CREATE TABLE ledger.meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);
INSERT INTO ledger.meta (key, value) VALUES
    ('role_prefix', current_setting('ledger.role_prefix')),
    ('clock_pinnable', 'false');

-- The role that plays an actor ('worker' -> 'ledger_worker').
CREATE FUNCTION ledger.role_name(actor text) RETURNS text
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT value || actor FROM ledger.meta WHERE key = 'role_prefix'
$$;

-- Every timestamp written or compared in SQL comes from here. A test may pin it
-- with SET LOCAL ledger.now = '...', but only in a database where the owner has
-- allowed that (ledger.meta clock_pinnable); in production a worker cannot move
-- the clock that judges its own lease.
CREATE FUNCTION ledger.now() RETURNS timestamptz
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

-- Runtime roles get no CREATE anywhere and no temporary objects: a shadowing
-- object has nowhere to live. Database-level privileges are not copied by
-- CREATE DATABASE ... TEMPLATE, so `ledger migrate` runs this every time, not
-- only here. Run by the administrator (SECURITY INVOKER).
CREATE FUNCTION ledger.secure_database() RETURNS void
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

RESET ROLE;
SELECT ledger.secure_database();
