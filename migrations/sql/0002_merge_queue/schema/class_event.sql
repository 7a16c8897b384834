-- What operators did to a class: its own journal
--
-- A campaign's journal records every operator action on it (actor_role
-- 'operator'); a class has no campaign journal, so pausing and resuming one
-- is kept here, with who did it, as which role and why. Append-only, like the
-- campaign journal. The autonomy report counts these as human actions
-- alongside the operator's journal events (ledger.queries, DAILY_ACTIVITY).

CREATE TABLE IF NOT EXISTS ledger.class_event (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    class       text NOT NULL REFERENCES ledger.campaign_class (name),
    type        text NOT NULL CHECK (type IN ('class.paused', 'class.resumed')),
    actor       text NOT NULL CHECK (length(actor) BETWEEN 1 AND 200),
    actor_role  text NOT NULL,
    reason      text CHECK (length(reason) <= 1000),
    created_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS class_event_by_class ON ledger.class_event (class, id);
CREATE INDEX IF NOT EXISTS class_event_recent ON ledger.class_event (created_at);

CREATE OR REPLACE FUNCTION ledger.class_event_append_only() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'a class''s journal is append-only (% refused)', TG_OP USING ERRCODE = 'LG009';
END
$$;

CREATE OR REPLACE TRIGGER class_event_append_only BEFORE UPDATE OR DELETE ON ledger.class_event
    FOR EACH ROW EXECUTE FUNCTION ledger.class_event_append_only();
CREATE OR REPLACE TRIGGER class_event_no_truncate BEFORE TRUNCATE ON ledger.class_event
    FOR EACH STATEMENT EXECUTE FUNCTION ledger.class_event_append_only();
