-- 0001 down: drop the schemas. Roles are cluster-wide and may serve other
-- databases on the same cluster, so they stay; privileges granted on this
-- database are taken back.
DROP SCHEMA IF EXISTS ledger_api CASCADE;
DROP SCHEMA IF EXISTS ledger CASCADE;

DO $$
DECLARE
    prefix text := current_setting('ledger.role_prefix');
BEGIN
    EXECUTE format('REVOKE CREATE ON DATABASE %I FROM %I', current_database(), prefix || 'owner');
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO PUBLIC', current_database());
END
$$;
