-- Roles and schemas
--
-- Run by the administrator (a superuser, or a role with CREATEROLE that owns
-- the database); every other schema file runs as the owner role. The migration
-- runner sets the session setting ledger.role_prefix before this file runs;
-- every role name below is that prefix plus a suffix.
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

    -- Memberships: every runtime role may read (and greet: ledger_api.hello); workers may reap.
    FOREACH suffix IN ARRAY ARRAY['sensor', 'worker', 'reaper', 'verifier', 'dispatcher', 'operator'] LOOP
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

    -- Server-side limits per runtime role, the same as each transaction takes
    -- on (ledger.database.SESSION_LIMITS): a statement nobody waits for any
    -- more, or a transaction whose client vanished, must not hold locks for
    -- hours. A role's settings apply to logins of that role; `ledger logins
    -- create` copies them onto the per-role logins it makes.
    -- Written only when they differ: roles are shared by every database of
    -- the cluster, and most migrations find them set already.
    FOREACH suffix IN ARRAY ARRAY['reader', 'sensor', 'worker', 'reaper',
                                  'verifier', 'dispatcher', 'operator'] LOOP
        DECLARE
            wanted text[] := ARRAY[
                'statement_timeout=' || CASE suffix WHEN 'reader' THEN '120s'
                                                    WHEN 'operator' THEN '300s' ELSE '30s' END,
                'idle_in_transaction_session_timeout=60s'];
            setting text;
        BEGIN
            FOREACH setting IN ARRAY wanted LOOP
                IF NOT EXISTS (
                    SELECT 1 FROM pg_catalog.pg_db_role_setting s
                      JOIN pg_catalog.pg_roles r ON r.oid = s.setrole
                     WHERE r.rolname = prefix || suffix AND s.setdatabase = 0
                       AND setting = ANY (s.setconfig)) THEN
                    EXECUTE format('ALTER ROLE %I SET %s = %L', prefix || suffix,
                                   split_part(setting, '=', 1), split_part(setting, '=', 2));
                END IF;
            END LOOP;
        END;
    END LOOP;

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
    -- owner needs no CREATE on the database. Every file after this one runs
    -- as the owner, so everything in the schemas is owned by it.
    EXECUTE format('CREATE SCHEMA IF NOT EXISTS ledger AUTHORIZATION %I', prefix || 'owner');
    EXECUTE format('CREATE SCHEMA IF NOT EXISTS ledger_api AUTHORIZATION %I', prefix || 'owner');
END
$$;
