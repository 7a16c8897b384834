-- The state machine
--
-- ledger.transition is the single source of truth (docs/state_machine.md is generated from it): the
-- campaign guard trigger (campaign.sql) refuses any state change that is not
-- one of its rows (for the acting role), keeps generation monotonic, keeps
-- terminal states sticky, and the journal trigger writes the event of every
-- state change in the same transaction. The Python side loads these same rows
-- to build its `transitions` machine. States and transitions are the
-- contract: they change only by a migration. Applied again, this file keeps
-- the rows it finds; a revision that changes a row does so with its own
-- UPDATE (contract_frozen admits it during a migration).

-- States of a campaign. Terminal states are sticky (the guard enforces it).
CREATE TABLE IF NOT EXISTS ledger.state (
    name        text PRIMARY KEY CHECK (name ~ '^[a-z_]+$'),
    is_terminal boolean NOT NULL,
    position    smallint NOT NULL UNIQUE,  -- display order
    description text NOT NULL
);

-- Who may perform a transition. db_role is the role suffix that executes the
-- function owning it; 'system' transitions happen only inside other functions.
CREATE TABLE IF NOT EXISTS ledger.actor (
    name        text PRIMARY KEY CHECK (name ~ '^[a-z_]+$'),
    db_role     text CHECK (db_role ~ '^[a-z_]+$'),
    description text NOT NULL
);

-- The one source of truth for the state machine (docs/state_machine.md is generated from it).
CREATE TABLE IF NOT EXISTS ledger.transition (
    name       text NOT NULL CHECK (name ~ '^[a-z_]+$'),
    from_state text REFERENCES ledger.state (name),  -- NULL: the campaign is created
    to_state   text NOT NULL REFERENCES ledger.state (name),
    owner_role text NOT NULL REFERENCES ledger.actor (name),
    -- How the transition changes the campaign's attempt_count (the charged
    -- attempts): +1 when an attempt is spent (a candidate recorded, a failure,
    -- a lost lease), -1 when a spent attempt is given back (an accepted
    -- candidate that cannot land on its moved target), 0 otherwise -- above
    -- all for a fault that is not the attempt's own (release). The guard
    -- trigger holds every state change to it: one accounting, in the schema.
    attempt_charge smallint NOT NULL DEFAULT 0 CHECK (attempt_charge BETWEEN -1 AND 1),
    note       text NOT NULL DEFAULT '',
    CONSTRAINT transition_unique UNIQUE NULLS NOT DISTINCT (name, from_state),
    CONSTRAINT transition_moves CHECK (from_state IS DISTINCT FROM to_state)
);

INSERT INTO ledger.state (name, is_terminal, position, description) VALUES
    ('ready',     false, 1, 'waiting for a worker (possibly after next_attempt_at)'),
    ('leased',    false, 2, 'a worker holds the lease and is making an attempt'),
    ('attempted', false, 3, 'an attempt produced a candidate; awaiting a verdict'),
    ('verified',  false, 4, 'the candidate passed independent verification'),
    ('awaiting_approval', false, 5, 'verified; its class asks a person before it is promoted (nothing is leased while it waits)'),
    ('exhausted', false, 6, 'attempts used up; a human decides'),
    ('budget_exhausted', false, 7, 'its reported cost reached its budget (max_cost): not started again until an operator raises it'),
    ('confirmed', true,  8, 'a scheduled observation after promotion was green'),
    ('dismissed', true,  9, 'the target turned green with nothing of ours in flight'),
    ('abandoned', true,  10, 'an operator stopped the campaign')
ON CONFLICT DO NOTHING;

INSERT INTO ledger.actor (name, db_role, description) VALUES
    ('sensor',     'sensor',     'observes targets, opens and closes campaigns'),
    ('worker',     'worker',     'claims campaigns and makes attempts'),
    ('reaper',     'reaper',     'returns expired leases to ready (runs in every worker process)'),
    ('verifier',   'verifier',   'checks candidates independently and records verdicts'),
    ('dispatcher', 'dispatcher', 'carries out side effects from the outbox'),
    ('operator',   'operator',   'a human or their tooling'),
    ('system',     NULL,         'follows from another transition inside the kernel')
ON CONFLICT DO NOTHING;

INSERT INTO ledger.transition (name, from_state, to_state, owner_role, attempt_charge, note) VALUES
    ('open',           NULL,        'ready',     'sensor', 0,     'idempotent: one open campaign per objective key'),
    ('claim',          'ready',     'leased',    'worker', 0,     'SKIP LOCKED; bumps generation; stamps owner and lease expiry'),
    ('record_attempt', 'leased',    'attempted', 'worker', 1,     'fenced by generation; candidate and bundle stored'),
    ('fail_attempt',   'leased',    'ready',     'worker', 1,     'fenced; the attempt''s own failure: failure reason; charged; backoff'),
    ('release',        'leased',    'ready',     'worker', 0,     'fenced; a fault that is not the attempt''s own (the system, its configuration, a worker shutting down): nothing charged; retried after a pause'),
    ('expire_lease',   'leased',    'ready',     'reaper', 1,     'only if the lease is still expired at the write; bumps generation'),
    ('accept',         'attempted', 'verified',  'verifier', 0,   'verifier identity differs from the attempt''s worker'),
    ('reject',         'attempted', 'ready',     'verifier', 0,   'the rejected fingerprint can never be attempted again'),
    ('promote_failed', 'verified',  'ready',     'dispatcher', -1, 'the target moved and the accepted candidate does not apply onto it: a new attempt is needed, and the spent one is given back'),
    ('confirm',        'verified',  'confirmed', 'sensor', 0,     'only an observation started after promotion counts'),
    ('regress',        'verified',  'ready',     'sensor', 0,     'red observation after promotion'),
    ('dismiss',        'ready',     'dismissed', 'sensor', 0,     'target green with nothing of ours in flight'),
    ('dismiss',        'exhausted', 'dismissed', 'sensor', 0,     'target green while exhausted: nothing left to decide'),
    ('dismiss',        'leased',    'dismissed', 'worker', 0,     'fenced; the worker re-observed the target green (the class''s sensor, once, in a cell) before its agent ran or before charging an attempt that changed nothing: nothing charged'),
    ('exhaust',        'ready',     'exhausted', 'system', 0,     'attempts used up'),
    ('reopen',         'exhausted', 'ready',     'operator', 0,   'a human grants more attempts'),
    ('abandon',        'ready',     'abandoned', 'operator', 0,   'bumps generation'),
    ('abandon',        'leased',    'abandoned', 'operator', 0,   'bumps generation: the worker is fenced out and told to stop'),
    ('abandon',        'attempted', 'abandoned', 'operator', 0,   'bumps generation'),
    ('abandon',        'verified',  'abandoned', 'operator', 0,   'bumps generation'),
    ('abandon',        'exhausted', 'abandoned', 'operator', 0,   'bumps generation'),
    ('rebase',         'verified',  'attempted', 'dispatcher', 0, 'the target moved: the candidate, rebased cleanly onto it, is verified again'),
    ('requeue',        'attempted', 'verified',  'verifier', 0,   'the merge queue''s stack of several candidates failed with this one on top: no verdict on it alone; back in the queue with its own candidate, nothing charged'),
    -- approval before promotion (approval.sql): the verdict is in, a person decides
    ('request_approval', 'verified', 'awaiting_approval', 'system', 0, 'the class''s approval policy asks a person first (the conditions that asked are journaled); nothing is leased while it waits'),
    ('approve',        'awaiting_approval', 'verified', 'operator', 0, 'never by the identity that made the attempt: its promotion is queued'),
    ('deny',           'awaiting_approval', 'ready', 'operator', 0, 'never by the identity that made the attempt: the reason is shown to the next attempt as a rejection, the approach refused'),
    ('abandon',        'awaiting_approval', 'abandoned', 'operator', 0, 'bumps generation (a denial that stops the campaign)'),
    ('approve_on_timeout', 'awaiting_approval', 'verified', 'system', 0, 'no decision in time, and the class approves then: its promotion is queued'),
    ('deny_on_timeout', 'awaiting_approval', 'ready', 'system', 0, 'no decision in time: denied, as the class says'),
    ('abandon_on_timeout', 'awaiting_approval', 'abandoned', 'system', 0, 'no decision in time: abandoned, as the class says; bumps generation'),
    -- budgets (limits.sql): a campaign whose reported cost reached its max_cost
    ('exhaust_budget', 'ready',     'budget_exhausted', 'system', 0, 'its reported cost reached max_cost: not started again (the figures are journaled)'),
    ('raise_budget',   'budget_exhausted', 'ready', 'operator', 0, 'an operator raised max_cost above what was spent: attempted again'),
    ('abandon',        'budget_exhausted', 'abandoned', 'operator', 0, 'bumps generation')
ON CONFLICT DO NOTHING;

-- Declares which transition the next state change is, who performs it and what
-- the journal should say about it. Kernel functions call this before their
-- UPDATE; the guard trigger reads it. Transaction-local.
--
-- Called several times per write, so (like the clock) these pin no search_path
-- of their own and make one statement of their settings. (As SQL functions
-- they were slower: called from plpgsql, a SQL function is planned on every
-- call.)
--
-- Each setting is an assignment, not a PERFORM: plpgsql evaluates an
-- assignment's expression itself, where a PERFORM (even of one SELECT with no
-- table) starts and ends a whole executor (bench/cost, callgrind).
CREATE OR REPLACE FUNCTION ledger.begin_transition(p_name text, p_role text, p_actor text,
                                                   p_detail jsonb DEFAULT '{}')
    RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    v text;
BEGIN
    v := pg_catalog.set_config('ledger.transition', p_name, true);
    v := pg_catalog.set_config('ledger.actor_role', p_role, true);
    v := pg_catalog.set_config('ledger.actor', coalesce(p_actor, p_role), true);
    v := pg_catalog.set_config('ledger.detail', coalesce(p_detail, '{}'::jsonb)::text, true);
END
$$;

-- The same, for a writer about to change many campaigns in one statement
-- (claim_campaigns, record_attempts, expire_leases): its state changes are
-- journaled by the statement trigger, in one INSERT, instead of row by row
-- (campaign_journal_batch in campaign.sql). Either way each state change
-- gets exactly one event: the two triggers' conditions are complements.
CREATE OR REPLACE FUNCTION ledger.begin_batch_transition(p_name text, p_role text, p_actor text,
                                                         p_detail jsonb DEFAULT '{}')
    RETURNS void
    LANGUAGE plpgsql
AS $$
BEGIN
    -- once per batch, so one more call costs nothing worth a second copy
    PERFORM ledger.begin_transition(p_name, p_role, p_actor, p_detail),
            pg_catalog.set_config('ledger.batch', 'on', true);
END
$$;

CREATE OR REPLACE FUNCTION ledger.end_transition() RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    v text;
BEGIN
    v := pg_catalog.set_config('ledger.transition', '', true);
    v := pg_catalog.set_config('ledger.actor_role', '', true);
    v := pg_catalog.set_config('ledger.detail', '', true);
    v := pg_catalog.set_config('ledger.batch', '', true);
END
$$;

-- Transitions and states are the contract; they change only by migration.
CREATE OR REPLACE FUNCTION ledger.contract_frozen() RETURNS trigger
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

CREATE OR REPLACE TRIGGER transition_frozen BEFORE INSERT OR UPDATE OR DELETE ON ledger.transition
    FOR EACH ROW EXECUTE FUNCTION ledger.contract_frozen();
CREATE OR REPLACE TRIGGER state_frozen BEFORE INSERT OR UPDATE OR DELETE ON ledger.state
    FOR EACH ROW EXECUTE FUNCTION ledger.contract_frozen();
