-- 0001 down: drop the schemas. Roles are cluster-wide and may serve other
-- databases on the same cluster, so they stay. PUBLIC gets TEMPORARY back.
DROP SCHEMA IF EXISTS ledger_api CASCADE;
DROP SCHEMA IF EXISTS ledger CASCADE;

DO $$
BEGIN
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO PUBLIC', current_database());
END
$$;
