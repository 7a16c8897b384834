-- Which code may use this schema (docs/upgrading.md: what may run together)
--
-- Every Ledger process greets the database before the first statement of
-- each session (a direct connection) or of each transaction (through a
-- pooler): ledger_api.hello(its release, the schema revision its code was
-- written for). The greeting is refused -- SQLSTATE LG012, one line naming
-- both versions -- for
--   code written for a newer schema than this one (LG012): run `ledger
--     migrate` with that code first; and
--   code older than the oldest this schema still serves (LG013; meta
--     oldest_client): each release keeps serving the release before it
--     (expand, then contract a release later), and says so here.
-- Nothing of a refused process's transaction runs: the greeting comes first.
-- Code of 0.2.0 and before predates the greeting; it is served while
-- oldest_client is its schema (0003) or older.

INSERT INTO ledger.meta (key, value) VALUES
    ('oldest_client', '0003_trace_context')
ON CONFLICT (key) DO NOTHING;

CREATE OR REPLACE FUNCTION ledger_api.hello(p_release text, p_schema text) RETURNS void
    LANGUAGE plpgsql
    STABLE
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_at text;
    v_oldest text;
BEGIN
    IF p_schema IS NULL OR p_schema !~ '^[0-9]{4}_[a-z0-9_]+$' OR length(p_schema) > 64
       OR p_release IS NULL OR length(p_release) > 64 THEN
        RAISE EXCEPTION 'a greeting names a release and a schema revision (e.g. 0.3.0, 0004_release_check)'
            USING ERRCODE = 'LG007';
    END IF;
    -- (the migration grants the owner SELECT on the record: ledger.db.migrations.finish)
    SELECT version_num INTO v_at FROM public.alembic_version;
    SELECT value INTO v_oldest FROM ledger.meta WHERE key = 'oldest_client';
    IF v_at IS NULL THEN
        RAISE EXCEPTION 'this database has no migration record' USING ERRCODE = 'LG012',
            HINT = format('run `ledger migrate` with Ledger %s', p_release);
    END IF;
    IF left(p_schema, 4) > left(v_at, 4) OR (left(p_schema, 4) = left(v_at, 4) AND p_schema <> v_at) THEN
        RAISE EXCEPTION 'Ledger % needs schema revision %; this database is at %', p_release, p_schema, v_at
            USING ERRCODE = 'LG012', DETAIL = format('code=%s database=%s oldest=%s', p_schema, v_at, v_oldest),
                  HINT = format('run `ledger migrate` with Ledger %s', p_release);
    END IF;
    IF left(p_schema, 4) < left(v_oldest, 4) THEN
        RAISE EXCEPTION 'Ledger % (schema %) is older than this database serves: it is at %, and serves code of % or later',
                p_release, p_schema, v_at, v_oldest
            USING ERRCODE = 'LG013', DETAIL = format('code=%s database=%s oldest=%s', p_schema, v_at, v_oldest),
                  HINT = 'upgrade Ledger on this machine';
    END IF;
END
$$;
