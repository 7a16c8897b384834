-- 0001 down: drop the schemas. Roles are cluster-wide and may serve other
-- databases on the same cluster, so they stay. The owner's functions get the
-- built-in default privileges back (grants.sql revoked them), and PUBLIC gets
-- TEMPORARY back.
DROP SCHEMA IF EXISTS ledger_api CASCADE;
DROP SCHEMA IF EXISTS ledger CASCADE;

DO $$
DECLARE
    owner text := current_setting('ledger.role_prefix') || 'owner';
BEGIN
    EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE %I GRANT EXECUTE ON FUNCTIONS TO PUBLIC', owner);
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO PUBLIC', current_database());
END
$$;
