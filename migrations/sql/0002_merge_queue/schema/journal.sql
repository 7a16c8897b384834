-- The journal: append-only, one gap-free seq per campaign
--
-- Every state change writes its event through the campaign journal trigger
-- (campaign.sql); other events come through append_event (inside kernel
-- functions) and ledger_api.append_events (the lease holder, api_worker.sql).

CREATE TABLE IF NOT EXISTS ledger.campaign_event (
    campaign_id bigint NOT NULL REFERENCES ledger.campaign (id),
    seq         bigint NOT NULL CHECK (seq > 0),
    -- (^[a-z][a-z0-9_.]{0,63}$, without the counted repetition: see
    -- ledger.is_event_type in api_helpers.sql)
    type        text NOT NULL CHECK (length(type) <= 64 AND type ~ '^[a-z][a-z0-9_.]*$'),
    actor       text NOT NULL,
    generation  bigint NOT NULL,
    -- deltas (output lines, progress) may be trimmed once the campaign is closed
    delta       boolean NOT NULL DEFAULT false,
    payload     jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL,
    -- the role that acted: the autonomy report decides "a human did this" by
    -- it (an operator's call, from the API, the dashboard or the CLI), never
    -- by the actor's name. The default reads ledger.actor_role, which
    -- begin_transition sets for every state change, so the journal trigger's
    -- events carry it; writers of other events set it where they know it.
    actor_role  text DEFAULT nullif(pg_catalog.current_setting('ledger.actor_role', true), ''),
    PRIMARY KEY (campaign_id, seq)
);
CREATE INDEX IF NOT EXISTS campaign_event_recent ON ledger.campaign_event (created_at);

-- The journal is append-only. Only the retention function may delete, and only
-- deltas (it sets ledger.retention for the length of its transaction).
CREATE OR REPLACE FUNCTION ledger.journal_append_only() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF TG_OP = 'DELETE' AND OLD.delta AND current_setting('ledger.retention', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the campaign journal is append-only (% refused)', TG_OP
        USING ERRCODE = 'LG009';
END
$$;

CREATE OR REPLACE TRIGGER campaign_event_append_only BEFORE UPDATE OR DELETE ON ledger.campaign_event
    FOR EACH ROW EXECUTE FUNCTION ledger.journal_append_only();
CREATE OR REPLACE TRIGGER campaign_event_no_truncate BEFORE TRUNCATE ON ledger.campaign_event
    FOR EACH STATEMENT EXECUTE FUNCTION ledger.journal_append_only();

-- Tails wake on this. Not for claims: a transaction that NOTIFYs takes a
-- cluster-wide lock at commit, which would make concurrent claimers queue
-- behind each other; the claimer's next write (its attempt.started event)
-- wakes the tails instead. Nor for recorded attempts: their hints are sent
-- after the commit (see campaign_journal in campaign.sql).
--
-- Per row, filtered by WHEN before any plpgsql runs; PostgreSQL folds
-- identical notifications of one transaction into one, so a batch of appends
-- to one campaign still sends one hint. (A statement trigger with a
-- transition table made every journal insert fill a tuplestore.)
--
-- Transition events are hinted by the journal triggers that write them
-- (campaign_journal, campaign_journal_batch in campaign.sql), which know the
-- new state without reading the payload: a WHEN is read back from its
-- stored text and compiled for every INSERT statement, and one that looked
-- into the payload for the state cost 63 K instructions per transition
-- (bench/cost, callgrind), this one a fraction.
CREATE OR REPLACE FUNCTION ledger.journal_notify() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify('ledger_event', NEW.campaign_id::text);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER campaign_event_notify AFTER INSERT ON ledger.campaign_event
    FOR EACH ROW
    WHEN (NEW.type <> 'transition')
    EXECUTE FUNCTION ledger.journal_notify();

-- Append one event to a campaign's journal (seq bumped under the row lock).
CREATE OR REPLACE FUNCTION ledger.append_event(p_campaign_id bigint, p_type text, p_actor text,
                                    p_payload jsonb DEFAULT '{}', p_delta boolean DEFAULT false)
    RETURNS bigint
    LANGUAGE plpgsql
AS $$
DECLARE
    v_seq bigint;
    v_generation bigint;
BEGIN
    UPDATE ledger.campaign c SET event_seq = c.event_seq + 1
     WHERE c.id = p_campaign_id
    RETURNING c.event_seq, c.generation INTO v_seq, v_generation;
    INSERT INTO ledger.campaign_event (campaign_id, seq, type, actor, generation, delta, payload, created_at)
    VALUES (p_campaign_id, v_seq, p_type, p_actor, v_generation, p_delta, p_payload, ledger.now());
    RETURN v_seq;
END
$$;
