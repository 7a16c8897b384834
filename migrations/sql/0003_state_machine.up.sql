-- 0003 state machine
--
-- The transition table is the single source of truth; a trigger refuses any
-- state change that is not one of its rows (for the acting role), keeps
-- generation monotonic, keeps terminal states sticky and writes the journal
-- event of every state change in the same transaction. The Python side loads
-- these same rows to build its `transitions` machine.

INSERT INTO ledger.state (name, is_terminal, position, description) VALUES
    ('ready',     false, 1, 'waiting for a worker (possibly after next_attempt_at)'),
    ('leased',    false, 2, 'a worker holds the lease and is making an attempt'),
    ('attempted', false, 3, 'an attempt produced a candidate; awaiting a verdict'),
    ('verified',  false, 4, 'the candidate passed independent verification'),
    ('exhausted', false, 5, 'attempts used up; a human decides'),
    ('confirmed', true,  6, 'a scheduled observation after promotion was green'),
    ('dismissed', true,  7, 'the target turned green with nothing of ours in flight'),
    ('abandoned', true,  8, 'an operator stopped the campaign');

INSERT INTO ledger.actor (name, db_role, description) VALUES
    ('sensor',     'sensor',     'observes targets, opens and closes campaigns'),
    ('worker',     'worker',     'claims campaigns and makes attempts'),
    ('reaper',     'reaper',     'returns expired leases to ready (runs in every worker process)'),
    ('verifier',   'verifier',   'checks candidates independently and records verdicts'),
    ('dispatcher', 'dispatcher', 'carries out side effects from the outbox'),
    ('operator',   'operator',   'a human or their tooling'),
    ('system',     NULL,         'follows from another transition inside the kernel');

INSERT INTO ledger.transition (name, from_state, to_state, owner_role, note) VALUES
    ('open',           NULL,        'ready',     'sensor',     'idempotent: one open campaign per objective key'),
    ('claim',          'ready',     'leased',    'worker',     'SKIP LOCKED; bumps generation; stamps owner and lease expiry'),
    ('record_attempt', 'leased',    'attempted', 'worker',     'fenced by generation; candidate and bundle stored'),
    ('fail_attempt',   'leased',    'ready',     'worker',     'fenced; failure reason; attempt_count+1; backoff'),
    ('expire_lease',   'leased',    'ready',     'reaper',     'only if the lease is still expired at the write; bumps generation'),
    ('accept',         'attempted', 'verified',  'verifier',   'verifier identity differs from the attempt''s worker'),
    ('reject',         'attempted', 'ready',     'verifier',   'the rejected fingerprint can never be attempted again'),
    ('promote_failed', 'verified',  'ready',     'dispatcher', 'the target moved: compare-and-swap failed'),
    ('confirm',        'verified',  'confirmed', 'sensor',     'only an observation started after promotion counts'),
    ('regress',        'verified',  'ready',     'sensor',     'red observation after promotion'),
    ('dismiss',        'ready',     'dismissed', 'sensor',     'target green with nothing of ours in flight'),
    ('exhaust',        'ready',     'exhausted', 'system',     'attempts used up'),
    ('reopen',         'exhausted', 'ready',     'operator',   'a human grants more attempts'),
    ('abandon',        'ready',     'abandoned', 'operator',   'bumps generation'),
    ('abandon',        'leased',    'abandoned', 'operator',   'bumps generation: the worker is fenced out and told to stop'),
    ('abandon',        'attempted', 'abandoned', 'operator',   'bumps generation'),
    ('abandon',        'verified',  'abandoned', 'operator',   'bumps generation'),
    ('abandon',        'exhausted', 'abandoned', 'operator',   'bumps generation');

-- Declares which transition the next state change is, who performs it and what
-- the journal should say about it. Kernel functions call this before their
-- UPDATE; the guard trigger reads it. Transaction-local.
CREATE FUNCTION ledger.begin_transition(p_name text, p_role text, p_actor text,
                                        p_detail jsonb DEFAULT '{}')
    RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM set_config('ledger.transition', p_name, true);
    PERFORM set_config('ledger.actor_role', p_role, true);
    PERFORM set_config('ledger.actor', coalesce(p_actor, p_role), true);
    PERFORM set_config('ledger.detail', coalesce(p_detail, '{}')::text, true);
END
$$;

CREATE FUNCTION ledger.end_transition() RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM set_config('ledger.transition', '', true);
    PERFORM set_config('ledger.actor_role', '', true);
    PERFORM set_config('ledger.detail', '', true);
END
$$;

CREATE FUNCTION ledger.campaign_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_name  text := nullif(current_setting('ledger.transition', true), '');
    v_role  text := nullif(current_setting('ledger.actor_role', true), '');
    v_owner text;
    v_now   timestamptz := ledger.now();
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT t.owner_role INTO v_owner FROM ledger.transition t
         WHERE t.name = v_name AND t.from_state IS NULL AND t.to_state = NEW.state;
        IF NOT FOUND OR v_owner IS DISTINCT FROM v_role THEN
            RAISE EXCEPTION 'a campaign can only be created by the open transition (got %, by %)',
                coalesce(v_name, 'none'), coalesce(v_role, 'nobody')
                USING ERRCODE = 'LG002';
        END IF;
        NEW.generation := 0;
        NEW.event_seq := 1;
        NEW.created_at := v_now;
        NEW.updated_at := v_now;
        RETURN NEW;
    END IF;

    IF (SELECT s.is_terminal FROM ledger.state s WHERE s.name = OLD.state) THEN
        RAISE EXCEPTION 'campaign % is %, a terminal state: it cannot change', OLD.id, OLD.state
            USING ERRCODE = 'LG002';
    END IF;
    IF NEW.generation < OLD.generation THEN
        RAISE EXCEPTION 'campaign %: generation never decreases (% -> %)',
            OLD.id, OLD.generation, NEW.generation
            USING ERRCODE = 'LG002';
    END IF;
    IF NEW.state IS DISTINCT FROM OLD.state THEN
        SELECT t.owner_role INTO v_owner FROM ledger.transition t
         WHERE t.name = v_name AND t.from_state = OLD.state AND t.to_state = NEW.state;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'illegal transition % of campaign %: % -> %',
                coalesce(v_name, '(none declared)'), OLD.id, OLD.state, NEW.state
                USING ERRCODE = 'LG002';
        END IF;
        IF v_owner IS DISTINCT FROM v_role THEN
            RAISE EXCEPTION 'transition % belongs to %, not %', v_name, v_owner, coalesce(v_role, 'nobody')
                USING ERRCODE = 'LG003';
        END IF;
        NEW.event_seq := OLD.event_seq + 1;
        IF (SELECT s.is_terminal FROM ledger.state s WHERE s.name = NEW.state) THEN
            NEW.closed_at := v_now;
        END IF;
    END IF;
    NEW.updated_at := v_now;
    RETURN NEW;
END
$$;

CREATE TRIGGER campaign_guard BEFORE INSERT OR UPDATE ON ledger.campaign
    FOR EACH ROW EXECUTE FUNCTION ledger.campaign_guard();

-- Journal event and wake-up hints for every state change, in the same
-- transaction: a rolled-back change leaves no event and wakes nobody.
CREATE FUNCTION ledger.campaign_journal() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_from text := CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END;
    v_detail jsonb := coalesce(nullif(current_setting('ledger.detail', true), '')::jsonb, '{}');
BEGIN
    INSERT INTO ledger.campaign_event (campaign_id, seq, type, actor, generation, payload, created_at)
    VALUES (NEW.id, NEW.event_seq, 'transition',
            coalesce(nullif(current_setting('ledger.actor', true), ''), 'system'),
            NEW.generation,
            v_detail || jsonb_build_object(
                'transition', current_setting('ledger.transition', true),
                'from', v_from, 'to', NEW.state,
                'attempt_count', NEW.attempt_count),
            ledger.now());
    -- Hints only (mechanism 5); payloads are ids.
    IF NEW.state = 'ready' THEN
        PERFORM pg_notify('ledger_ready', NEW.id::text);
    ELSIF NEW.state = 'attempted' THEN
        PERFORM pg_notify('ledger_attempted', NEW.id::text);
    END IF;
    IF v_from = 'leased' AND NEW.state <> 'attempted' AND NEW.generation > OLD.generation THEN
        -- the lease holder was fenced out (reaped or abandoned): tell it to stop
        PERFORM pg_notify('ledger_cancel', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER campaign_journal_insert AFTER INSERT ON ledger.campaign
    FOR EACH ROW EXECUTE FUNCTION ledger.campaign_journal();
CREATE TRIGGER campaign_journal_update AFTER UPDATE ON ledger.campaign
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION ledger.campaign_journal();

-- The journal is append-only. Only the retention function may delete, and only
-- deltas (it sets ledger.retention for the length of its transaction).
CREATE FUNCTION ledger.journal_append_only() RETURNS trigger
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

CREATE TRIGGER campaign_event_append_only BEFORE UPDATE OR DELETE ON ledger.campaign_event
    FOR EACH ROW EXECUTE FUNCTION ledger.journal_append_only();
CREATE TRIGGER campaign_event_no_truncate BEFORE TRUNCATE ON ledger.campaign_event
    FOR EACH STATEMENT EXECUTE FUNCTION ledger.journal_append_only();

-- Tails wake on this; one hint per campaign per statement, however many rows.
-- Not for claims: a transaction that NOTIFYs takes a cluster-wide lock at
-- commit, which would make concurrent claimers queue behind each other. The
-- claimer's next write (its attempt.started event) wakes the tails instead.
CREATE FUNCTION ledger.journal_notify() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('ledger_event', e.campaign_id::text)
       FROM (SELECT DISTINCT a.campaign_id FROM appended a
              WHERE NOT (a.type = 'transition' AND a.payload ->> 'to' = 'leased')) e;
    RETURN NULL;
END
$$;

CREATE TRIGGER campaign_event_notify AFTER INSERT ON ledger.campaign_event
    REFERENCING NEW TABLE AS appended
    FOR EACH STATEMENT EXECUTE FUNCTION ledger.journal_notify();

-- An attempt ends once; a verdict is given once.
CREATE FUNCTION ledger.attempt_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF OLD.outcome <> 'running' AND NEW.outcome IS DISTINCT FROM OLD.outcome THEN
        RAISE EXCEPTION 'attempt % of campaign % already ended as %',
            OLD.attempt_no, OLD.campaign_id, OLD.outcome
            USING ERRCODE = 'LG002';
    END IF;
    IF OLD.verdict IS NOT NULL AND NEW.verdict IS DISTINCT FROM OLD.verdict THEN
        RAISE EXCEPTION 'attempt % of campaign % already has the verdict %',
            OLD.attempt_no, OLD.campaign_id, OLD.verdict
            USING ERRCODE = 'LG002';
    END IF;
    IF NEW.generation <> OLD.generation OR NEW.campaign_id <> OLD.campaign_id
       OR NEW.worker <> OLD.worker THEN
        RAISE EXCEPTION 'an attempt''s identity cannot change' USING ERRCODE = 'LG002';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER attempt_guard BEFORE UPDATE ON ledger.attempt
    FOR EACH ROW EXECUTE FUNCTION ledger.attempt_guard();

-- Transitions, states and actors are the contract; they change only by migration.
CREATE FUNCTION ledger.contract_frozen() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF current_setting('ledger.migrating', true) = 'on' THEN
        RETURN coalesce(NEW, OLD);
    END IF;
    RAISE EXCEPTION '% is changed only by a migration', TG_TABLE_NAME USING ERRCODE = 'LG009';
END
$$;

CREATE TRIGGER transition_frozen BEFORE INSERT OR UPDATE OR DELETE ON ledger.transition
    FOR EACH ROW EXECUTE FUNCTION ledger.contract_frozen();
CREATE TRIGGER state_frozen BEFORE INSERT OR UPDATE OR DELETE ON ledger.state
    FOR EACH ROW EXECUTE FUNCTION ledger.contract_frozen();
