-- Campaign classes and campaigns
--
-- The data of Ledger is owner-only: no runtime role has any privilege on its
-- tables; they read through views (views.sql) and write through ledger_api
-- functions. Status columns are checked against a closed list, except
-- campaign.state: the guard trigger below admits only the to_state of a
-- declared transition, and ledger.transition references ledger.state.

-- Whether a document is within the bounds every role's input is held to
-- (ledger.bounds says the same in Python, and the API refuses first, naming
-- the field): at most p_bytes of text as PostgreSQL prints it, and no value
-- deeper than p_depth levels ('{"a": 1}' is one level). Every reader renders
-- what a role stored, so a document one role may store must be one that all
-- of them can read.
CREATE OR REPLACE FUNCTION ledger.json_within(p_doc jsonb, p_depth integer, p_bytes integer)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT octet_length(p_doc::text) <= p_bytes
       AND NOT jsonb_path_exists(p_doc, format('strict $.**{%s}', p_depth + 1)::jsonpath)
$$;

-- A kind of campaign: attempt budget, lease length, backoff, who may touch what.
-- The worker-side config (attempt command, repository) lives in ledger.toml;
-- what the kernel must judge lives here.
CREATE TABLE IF NOT EXISTS ledger.campaign_class (
    name            text PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    max_attempts    integer NOT NULL DEFAULT 3 CHECK (max_attempts BETWEEN 1 AND 1000),
    -- finite and bounded: NaN passed `lease_seconds > 0` (register_class also
    -- names the argument in its own error, ledger.check_range)
    lease_seconds   double precision NOT NULL DEFAULT 60 CHECK (lease_seconds > 0 AND lease_seconds <= 604800),
    backoff_base_s  double precision NOT NULL DEFAULT 5 CHECK (backoff_base_s BETWEEN 0 AND 604800),
    backoff_factor  double precision NOT NULL DEFAULT 2 CHECK (backoff_factor BETWEEN 1 AND 1000),
    backoff_cap_s   double precision NOT NULL DEFAULT 600 CHECK (backoff_cap_s BETWEEN 0 AND 604800),
    backoff_jitter  double precision NOT NULL DEFAULT 0.1 CHECK (backoff_jitter BETWEEN 0 AND 1),
    -- which campaigns share a seat (one lease per seat): none, or one per target
    seat_policy     text NOT NULL DEFAULT 'none' CHECK (seat_policy IN ('none', 'target')),
    -- {"worker": {"refs": ["refs/heads/ledger/*"], "hosts": []}, "dispatcher": {...}}
    authority       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(authority) = 'object'),
    acceptance      jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(acceptance) = 'object'),
    -- where a verified candidate is promoted: {"repository": "...", "ref": "refs/heads/main"}
    promotion       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(promotion) = 'object'),
    verifier        text NOT NULL DEFAULT 'command',
    -- the quorum: every one of these verifier kinds must accept, in this
    -- order (one verification each per attempt); the first is `verifier`
    verifiers       text[] NOT NULL DEFAULT '{command}'
                    CONSTRAINT campaign_class_verifiers_quorum
                    CHECK (cardinality(verifiers) BETWEEN 1 AND 8 AND verifiers[1] = verifier
                           AND array_position(verifiers, NULL) IS NULL),
    -- this class's share of claims when several classes have ready work
    -- (claim_campaign): a class of weight 2 gets two turns for another's one
    weight          integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    -- how often a worker renews a lease of this class (ledger.toml's
    -- heartbeat_s; NULL: not said, a third of the lease is assumed): a lease
    -- whose last renewal is overdue is at risk, one that is merely short is not
    heartbeat_seconds double precision CHECK (heartbeat_seconds > 0 AND heartbeat_seconds < lease_seconds),
    -- an operator paused the class (pause_class): claims skip it, attempts in
    -- flight finish; who and why are in ledger.class_event
    paused_at       timestamptz,
    -- whether a person approves a verified candidate before it is promoted
    -- (approval.sql): {} or {"mode": "never"} never; {"mode": "always"}; or
    -- {"mode": "when", "when": [conditions]}, with "timeout_s", "on_timeout"
    -- and "notify" (checked by ledger.check_approval_policy at registration)
    approval        jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(approval) = 'object'),
    -- limits (limits.sql): the templates of the keys its campaigns are
    -- counted under ('class', 'repo', a label's name such as 'tenant', or a
    -- key such as 'team:infra'), the rate-limited resources its attempts
    -- use, and each campaign's budget (max_cost, in the currency unit the
    -- agents report; NULL: none)
    limit_keys      text[] NOT NULL DEFAULT '{}'
                    CONSTRAINT campaign_class_limit_keys_check
                    CHECK (cardinality(limit_keys) <= 16 AND array_position(limit_keys, NULL) IS NULL),
    resources       text[] NOT NULL DEFAULT '{}'
                    CONSTRAINT campaign_class_resources_check
                    CHECK (cardinality(resources) <= 8 AND array_position(resources, NULL) IS NULL),
    max_cost        numeric CONSTRAINT campaign_class_max_cost_check CHECK (max_cost > 0 AND max_cost <= 1000000000),
    -- the key template its claims are fair across (fair claims: the key
    -- with the fewest leases for its weight goes first), such as 'tenant'
    fair_key        text CONSTRAINT campaign_class_fair_key_check CHECK (fair_key ~ '^[a-z][a-z0-9_.-]{0,31}$')
);

CREATE TABLE IF NOT EXISTS ledger.campaign (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    class               text NOT NULL REFERENCES ledger.campaign_class (name),
    -- The row's own rules (lengths, counts, the lease iff leased) are kept
    -- by the guard trigger below, not by CHECK constraints: see there.
    objective_key       text NOT NULL,  -- 1 to 500 characters
    target              text NOT NULL,  -- 1 to 2000 characters
    -- bounded (ledger.json_within): the opening observation holds the
    -- observation's details (32 levels, 256 KiB) one level down; written at
    -- the open only: the guard checks them there (ledger.check_documents)
    desired_state       jsonb NOT NULL DEFAULT '{}',  -- bounded: campaign_desired_state_bounded
    opening_observation jsonb NOT NULL DEFAULT '{}',  -- bounded: campaign_opening_observation_bounded
    -- no foreign key to ledger.state and no CHECK: see the guard below
    state               text NOT NULL,
    lease_owner         text,
    leased_at           timestamptz,
    lease_expires_at    timestamptz,
    generation          bigint NOT NULL DEFAULT 0,  -- from 0, never decreasing
    attempt_count       integer NOT NULL DEFAULT 0,  -- 0 or more
    max_attempts        integer NOT NULL,  -- 1 or more
    next_attempt_at     timestamptz NOT NULL,
    last_failure_reason text,
    acceptance_criteria jsonb NOT NULL DEFAULT '{}',
    evidence_location   text,
    seat                text,  -- NULL or not empty
    priority            integer NOT NULL DEFAULT 0,
    labels              text[] NOT NULL DEFAULT '{}',
    -- last journal seq; bumped under this row's lock, so seqs are gap-free
    event_seq           bigint NOT NULL DEFAULT 0,
    -- the key of the lease holder's last journal batch and that batch's last
    -- seq: a batch sent again (its reply was lost) returns the seq it got
    -- instead of being appended twice (append_events); written by the UPDATE
    -- that takes the seqs anyway
    last_append_key     text,
    last_append_seq     bigint,
    promoted_at         timestamptz,
    promoted_sha        text,
    -- Why the campaign is held back by something that is not its attempts'
    -- doing, and since when: a system fault (a remote down, a missing
    -- candidate, a configuration error, Ledger's own crash) or a condition
    -- of the target (a dirty checkout). Set by the release paths, cleared by
    -- the next real step; fault_count drives the pause between retries.
    waiting_on          text,  -- NULL, system_fault or target; with a reason (campaign_waiting_says_why)
    waiting_reason      text,  -- at most 4000 characters
    waiting_since       timestamptz,
    fault_count         integer NOT NULL DEFAULT 0,  -- 0 or more
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    closed_at           timestamptz,
    -- The W3C trace context of the open ({"traceparent": ..., "tracestate":
    -- ...}; NULL when the opener was not tracing): every later step's span,
    -- in whichever process or machine, joins the trace it names
    -- (ledger.tracing). Written once, by the open (ledger.open_campaign,
    -- which checks its form there rather than by a CHECK every UPDATE would
    -- pay for); nothing changes it afterwards. Added by 0003_trace_context.
    trace_context       jsonb,
    -- limits (limits.sql), set at the open from the class and the labels:
    -- the keys it is counted under, the resources its attempts use, its
    -- budget (NULL: none) and what its attempts reported they cost, summed
    -- (the API checks every figure; ledger.report_usage)
    limit_keys          text[] NOT NULL DEFAULT '{}',
    resources           text[] NOT NULL DEFAULT '{}',
    max_cost            numeric,
    cost_spent          numeric NOT NULL DEFAULT 0,
    -- its key of the class's fair_key template (tenant:acme), or NULL
    fair_key            text,
    -- while leased: the shard of each of its limit_keys its lease holds
    -- (limits.sql, ledger.take_slot), in the order of limit_keys
    limit_shards        smallint[]
    -- leased, and only then, with an owner and an expiry (campaign_lease_iff_leased)
);

-- Invariants as indexes (README "How it works").
-- One open campaign per objective (exhausted is open: a human decides).
CREATE UNIQUE INDEX IF NOT EXISTS campaign_one_open_per_objective ON ledger.campaign (objective_key)
    WHERE state NOT IN ('confirmed', 'dismissed', 'abandoned');

-- One leased campaign per seat; a NULL seat is unlimited.
CREATE UNIQUE INDEX IF NOT EXISTS campaign_one_lease_per_seat ON ledger.campaign (seat)
    WHERE state = 'leased' AND seat IS NOT NULL;

-- The claim path: ready rows of each class in claim order, and nothing else.
-- Claims are fair across classes (claim_campaign): each claim probes one
-- class's head, so the class leads the index.
CREATE INDEX IF NOT EXISTS campaign_claim_order ON ledger.campaign (class, priority DESC, created_at, id)
    WHERE state = 'ready';
-- Fair claims across the keys of a class (limits.sql, ledger.fair_keys):
-- the keys with ready work by a skip scan, then each key's head in claim order.
CREATE INDEX IF NOT EXISTS campaign_fair_order
    ON ledger.campaign (class, fair_key, priority DESC, created_at, id)
    WHERE state = 'ready' AND fair_key IS NOT NULL;

-- Whose turn it is: one number per claim, shared by every claimer. A
-- sequence, not a counter row: nextval takes no lock that lasts to commit,
-- so concurrent claimers never queue on it (a counter row would serialise
-- every claim behind the previous claim's commit).
CREATE SEQUENCE IF NOT EXISTS ledger.claim_turn AS bigint CYCLE;
CREATE INDEX IF NOT EXISTS campaign_lease_expiry ON ledger.campaign (lease_expires_at)
    WHERE state = 'leased';
CREATE INDEX IF NOT EXISTS campaign_awaiting_verdict ON ledger.campaign (updated_at, id)
    WHERE state = 'attempted';
CREATE INDEX IF NOT EXISTS campaign_recent ON ledger.campaign (updated_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS campaign_by_class_state ON ledger.campaign (class, state);
-- The few campaigns waiting on a system fault or their target (the waiting
-- gauge, /readyz).
CREATE INDEX IF NOT EXISTS campaign_waiting ON ledger.campaign (class, waiting_on)
    WHERE waiting_on IS NOT NULL;

-- The triggers and helpers of the hot path (campaign_guard, campaign_journal,
-- journal_notify, attempt_guard, append_event, begin/end_transition, now) pin
-- no search_path of their own: they inherit the pinned search_path of the
-- SECURITY DEFINER function that calls them (runtime roles can neither call
-- them nor write the tables directly), and they name everything
-- schema-qualified. A pinned search_path costs a setting push and pop per call.

-- A campaign's documents within the bounds every role's input is held to
-- (desired_state: 32 levels, 256 KiB; the opening observation holds the
-- observation's details one level down), raised as the CHECKs they were.
CREATE OR REPLACE FUNCTION ledger.check_documents(p_c ledger.campaign) RETURNS void
    LANGUAGE plpgsql
AS $$
BEGIN
    IF NOT (jsonb_typeof(p_c.desired_state) = 'object' AND ledger.json_within(p_c.desired_state, 32, 262144)) THEN
        PERFORM ledger.refuse_row('campaign', 'campaign_desired_state_bounded');
    END IF;
    IF NOT (jsonb_typeof(p_c.opening_observation) = 'object'
            AND ledger.json_within(p_c.opening_observation, 33, 266240)) THEN
        PERFORM ledger.refuse_row('campaign', 'campaign_opening_observation_bounded');
    END IF;
END
$$;

-- A broken row rule, raised as the CHECK constraint it stands for would be
-- (the guards below keep campaign's and attempt's rules).
CREATE OR REPLACE FUNCTION ledger.refuse_row(p_table text, p_constraint text) RETURNS void
    LANGUAGE plpgsql
AS $$
BEGIN
    RAISE EXCEPTION 'new row for relation "%" violates check constraint "%"', p_table, p_constraint
        USING ERRCODE = 'check_violation', CONSTRAINT = p_constraint, TABLE = p_table, SCHEMA = 'ledger';
END
$$;

-- The guard refuses any state change that is not a declared transition for
-- the acting role (see begin_transition in state_machine.sql), keeps
-- generation monotonic and terminal states sticky, and stamps the times and
-- the journal seq.
--
-- campaign.state references no table: with a foreign key to ledger.state,
-- every state change took a KEY SHARE lock on one of eight rows, and
-- concurrent writers piled multixacts and WAL-logged lock records onto one
-- heap page. A CHECK listing the eight names was no better: PostgreSQL
-- re-reads a table's CHECK expressions from their stored text on every
-- INSERT and UPDATE, and that one was the longest (perf: ExecConstraints ->
-- stringToNode, ~4 % of a cycle). The guard admits only the to_state of a
-- declared transition, and ledger.transition's columns reference
-- ledger.state: that is the invariant, in the schema, at no extra cost.
--
-- It answers its three lookups (is the old state terminal, which transition
-- is this, is the new state terminal) in one query.
--
-- It also keeps the row's own rules, which were CHECK constraints: PostgreSQL
-- reads a table's CHECK expressions back from their stored text, plans and
-- compiles them for every INSERT and UPDATE statement (a plpgsql function's
-- cached plan included), ~25 K instructions each, where this trigger's one
-- test is compiled once per session: the seven of campaign were 0.35 M of the
-- 4.7 M instructions of an N=1 claim + record (bench/cost, callgrind). A
-- broken rule raises what the CHECK raised: SQLSTATE 23514 and the
-- constraint's old name (ledger.refuse_row). The generation needs no test of
-- its own: an INSERT sets it to 0, and no UPDATE may decrease it (below).
CREATE OR REPLACE FUNCTION ledger.campaign_guard() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    v_name  text := nullif(current_setting('ledger.transition', true), '');
    v_role  text := nullif(current_setting('ledger.actor_role', true), '');
    v_owner text;
    v_known boolean;
    v_old_terminal boolean;
    v_new_terminal boolean;
    v_charge smallint;
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
    ELSE
        IF NEW.state IS DISTINCT FROM OLD.state THEN
            SELECT so.is_terminal, sn.is_terminal, t.owner_role, t.name IS NOT NULL, t.attempt_charge
              INTO v_old_terminal, v_new_terminal, v_owner, v_known, v_charge
              FROM ledger.state so
              LEFT JOIN ledger.state sn ON sn.name = NEW.state
              LEFT JOIN ledger.transition t
                     ON t.name = v_name AND t.from_state = OLD.state AND t.to_state = NEW.state
             WHERE so.name = OLD.state;
        ELSE
            SELECT so.is_terminal INTO v_old_terminal FROM ledger.state so WHERE so.name = OLD.state;
        END IF;
        IF v_old_terminal THEN
            RAISE EXCEPTION 'campaign % is %, a terminal state: it cannot change', OLD.id, OLD.state
                USING ERRCODE = 'LG002';
        END IF;
        IF NEW.generation < OLD.generation THEN
            RAISE EXCEPTION 'campaign %: generation never decreases (% -> %)',
                OLD.id, OLD.generation, NEW.generation
                USING ERRCODE = 'LG002';
        END IF;
        IF NEW.state IS DISTINCT FROM OLD.state THEN
            IF NOT coalesce(v_known, false) THEN
                RAISE EXCEPTION 'illegal transition % of campaign %: % -> %',
                    coalesce(v_name, '(none declared)'), OLD.id, OLD.state, NEW.state
                    USING ERRCODE = 'LG002';
            END IF;
            IF v_owner IS DISTINCT FROM v_role THEN
                RAISE EXCEPTION 'transition % belongs to %, not %', v_name, v_owner, coalesce(v_role, 'nobody')
                    USING ERRCODE = 'LG003';
            END IF;
            -- One accounting of attempts: the transition says what it charges.
            IF NEW.attempt_count - OLD.attempt_count IS DISTINCT FROM v_charge THEN
                RAISE EXCEPTION 'transition % of campaign % changes attempt_count by %, not by %',
                    v_name, OLD.id, NEW.attempt_count - OLD.attempt_count, v_charge
                    USING ERRCODE = 'LG002';
            END IF;
            NEW.event_seq := OLD.event_seq + 1;
            IF v_new_terminal THEN
                NEW.closed_at := v_now;
            END IF;
            IF v_name IS DISTINCT FROM 'release' THEN
                -- a real step: whatever held the campaign back is over
                NEW.waiting_on := NULL;
                NEW.waiting_reason := NULL;
                NEW.waiting_since := NULL;
                IF v_name IN ('record_attempt', 'fail_attempt', 'expire_lease', 'reject', 'accept') THEN
                    NEW.fault_count := 0;
                END IF;
            END IF;
        ELSIF NEW.attempt_count IS DISTINCT FROM OLD.attempt_count AND NEW.attempt_count >= 0 THEN
            -- (a negative count is the row rule's below, by its name)
            RAISE EXCEPTION 'campaign %: attempt_count changes only with a transition', OLD.id
                USING ERRCODE = 'LG002';
        END IF;
    END IF;
    NEW.updated_at := v_now;
    -- The documents' bounds (ledger.json_within: what every reader can
    -- render): on the row as created, and again only on an update that
    -- changes one. As CHECKs they were evaluated on every UPDATE, though only
    -- the open writes them: ~85 us of the ~120 us each transition's UPDATE
    -- cost (bench/cost).
    IF TG_OP = 'INSERT' THEN
        PERFORM ledger.check_documents(NEW);
    ELSIF NEW.desired_state IS DISTINCT FROM OLD.desired_state
          OR NEW.opening_observation IS DISTINCT FROM OLD.opening_observation THEN
        PERFORM ledger.check_documents(NEW);
    END IF;
    -- The row's own rules, on the row as it will be written (a CHECK is tested
    -- after the BEFORE triggers). NULL passes, as it passes a CHECK: seat may
    -- be NULL.
    IF length(NEW.objective_key) NOT BETWEEN 1 AND 500 OR length(NEW.target) NOT BETWEEN 1 AND 2000
       OR NEW.attempt_count < 0 OR NEW.max_attempts < 1 OR NEW.seat = ''
       OR (NEW.state = 'leased') <> (NEW.lease_owner IS NOT NULL AND NEW.lease_expires_at IS NOT NULL)
       OR NEW.waiting_on NOT IN ('system_fault', 'target') OR length(NEW.waiting_reason) > 4000
       OR (NEW.waiting_on IS NULL) <> (NEW.waiting_reason IS NULL) OR NEW.fault_count < 0 THEN
        -- the first broken one by name, as PostgreSQL tests CHECKs
        PERFORM ledger.refuse_row('campaign', CASE
            WHEN NEW.attempt_count < 0 THEN 'campaign_attempt_count_check'
            WHEN (NEW.state = 'leased') <> (NEW.lease_owner IS NOT NULL AND NEW.lease_expires_at IS NOT NULL)
                THEN 'campaign_lease_iff_leased'
            WHEN NEW.max_attempts < 1 THEN 'campaign_max_attempts_check'
            WHEN length(NEW.objective_key) NOT BETWEEN 1 AND 500 THEN 'campaign_objective_key_check'
            WHEN NEW.seat = '' THEN 'campaign_seat_check'
            WHEN NEW.waiting_on NOT IN ('system_fault', 'target') THEN 'campaign_waiting_on_check'
            WHEN length(NEW.waiting_reason) > 4000 THEN 'campaign_waiting_reason_check'
            WHEN (NEW.waiting_on IS NULL) <> (NEW.waiting_reason IS NULL) THEN 'campaign_waiting_says_why'
            WHEN NEW.fault_count < 0 THEN 'campaign_fault_count_check'
            ELSE 'campaign_target_check' END);
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER campaign_guard BEFORE INSERT OR UPDATE ON ledger.campaign
    FOR EACH ROW EXECUTE FUNCTION ledger.campaign_guard();

-- No campaign rests in ready with its attempts spent: every path that
-- charges an attempt and returns to ready must exhaust the campaign in the
-- same transaction (exhaust_if_spent). Checked at commit, on the row as it
-- is then; queued only by the rare update that makes a spent ready row.
-- (SECURITY DEFINER: it fires at commit, after the API function that made
-- the change has returned, as the session's runtime role.)
CREATE OR REPLACE FUNCTION ledger.campaign_spent_check() RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger.campaign c
                WHERE c.id = NEW.id AND c.state = 'ready' AND c.attempt_count >= c.max_attempts) THEN
        RAISE EXCEPTION 'campaign % is ready with its % attempt(s) spent: it must be exhausted',
            NEW.id, NEW.max_attempts USING ERRCODE = 'LG002';
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS campaign_spent_check ON ledger.campaign;
CREATE CONSTRAINT TRIGGER campaign_spent_check AFTER INSERT OR UPDATE ON ledger.campaign
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.state = 'ready' AND NEW.attempt_count >= NEW.max_attempts)
    EXECUTE FUNCTION ledger.campaign_spent_check();

CREATE OR REPLACE FUNCTION ledger.campaign_journal() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    v_from text := CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END;
    v_name text := current_setting('ledger.transition', true);
    v_detail jsonb := coalesce(nullif(current_setting('ledger.detail', true), '')::jsonb, '{}');
    v_actor text := coalesce(nullif(current_setting('ledger.actor', true), ''), 'system');
    v_cancelled bigint[];
BEGIN
    -- (record_attempt names the attempt in its detail and its holder as the
    -- actor; record_attempts is journaled by campaign_journal_batch.)
    -- A generation whose attempt is over without success, or that is
    -- superseded (a rebase), or a campaign abandoned, takes its pending
    -- intents with it: nothing a lost lease asked for is carried out later. Claimed intents are mid-dispatch; their
    -- dispatcher confirms the generation just before acting.
    IF v_from IN ('leased', 'attempted', 'verified', 'awaiting_approval')
           AND NEW.state NOT IN ('attempted', 'verified', 'awaiting_approval', 'confirmed')
       OR NEW.state = 'abandoned'
       OR (v_from IN ('attempted', 'verified') AND NEW.generation > OLD.generation) THEN
        WITH cancelled AS (
            UPDATE ledger.side_effect s
               SET state = 'cancelled', finished_at = ledger.now(), updated_at = ledger.now(),
                   error = format('generation %s of the campaign ended (%s)', s.generation,
                                  coalesce(v_name, NEW.state))
             WHERE s.campaign_id = NEW.id AND s.state = 'pending' AND s.generation <= OLD.generation
            RETURNING s.id
        )
        SELECT array_agg(c.id ORDER BY c.id) INTO v_cancelled FROM cancelled c;
        IF v_cancelled IS NOT NULL THEN
            v_detail := v_detail || jsonb_build_object('cancelled_intents', to_jsonb(v_cancelled));
        END IF;
    END IF;
    INSERT INTO ledger.campaign_event (campaign_id, seq, type, actor, generation, payload, created_at)
    VALUES (NEW.id, NEW.event_seq, 'transition', v_actor,
            NEW.generation,
            v_detail || jsonb_build_object(
                'transition', v_name,
                'from', v_from, 'to', NEW.state,
                'attempt_count', NEW.attempt_count),
            ledger.now());
    -- Hints only (README "How it works": wake-ups are hints, rows are truth);
    -- payloads are ids. Tails wake on every transition but into leased (claims
    -- never NOTIFY: journal.sql) and into attempted (hinted after the record's
    -- commit).
    IF NEW.state NOT IN ('leased', 'attempted') THEN
        PERFORM pg_notify('ledger_event', NEW.id::text);
    END IF;
    IF NEW.state = 'ready' THEN
        PERFORM pg_notify('ledger_ready', NEW.id::text);
    END IF;
    IF v_from = 'leased' AND NEW.state <> 'attempted' AND NEW.generation > OLD.generation THEN
        -- the lease holder was fenced out (reaped or abandoned): tell it to stop
        PERFORM pg_notify('ledger_cancel', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER campaign_journal_insert AFTER INSERT ON ledger.campaign
    FOR EACH ROW EXECUTE FUNCTION ledger.campaign_journal();
-- One state change at a time (the usual writer): per row, filtered by WHEN
-- before any plpgsql runs. A batch writer (begin_batch_transition sets
-- ledger.batch) is journaled by the statement trigger below instead; the two
-- WHEN conditions are complements, so every state change gets one event.
CREATE OR REPLACE TRIGGER campaign_journal_update AFTER UPDATE ON ledger.campaign
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state
          AND pg_catalog.current_setting('ledger.batch', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION ledger.campaign_journal();

-- The batch path: what campaign_journal does for one row, for every row the
-- statement changed state of, in one INSERT (and one UPDATE of the pending
-- intents it cancels), reading the statement's transition tables. Per row,
-- a batch of 100 entered plpgsql, planned nothing new but executed an
-- INSERT (and its foreign-key check) 100 times.
CREATE OR REPLACE FUNCTION ledger.campaign_journal_batch() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    v_name text := current_setting('ledger.transition', true);
    v_detail jsonb := coalesce(nullif(current_setting('ledger.detail', true), '')::jsonb, '{}');
    v_actor text := coalesce(nullif(current_setting('ledger.actor', true), ''), 'system');
BEGIN
    WITH changed AS (
        SELECT n.id, o.state AS from_state, n.state AS to_state, o.generation AS old_generation,
               n.generation, n.event_seq, n.attempt_count, o.lease_owner AS old_owner
          FROM batch_old o JOIN batch_new n ON n.id = o.id
         WHERE o.state IS DISTINCT FROM n.state
    ), cancelled AS (
        -- as in campaign_journal: a generation that ended without success
        -- (or was superseded, or abandoned) takes its pending intents along
        UPDATE ledger.side_effect s
           SET state = 'cancelled', finished_at = ledger.now(), updated_at = ledger.now(),
               error = format('generation %s of the campaign ended (%s)', s.generation,
                              coalesce(v_name, ch.to_state))
          FROM changed ch
         WHERE s.campaign_id = ch.id AND s.state = 'pending' AND s.generation <= ch.old_generation
           AND (ch.from_state IN ('leased', 'attempted', 'verified', 'awaiting_approval')
                    AND ch.to_state NOT IN ('attempted', 'verified', 'awaiting_approval', 'confirmed')
                OR ch.to_state = 'abandoned'
                OR (ch.from_state IN ('attempted', 'verified') AND ch.generation > ch.old_generation))
        RETURNING s.id, s.campaign_id
    ), cancelled_by AS (
        SELECT c.campaign_id,
               jsonb_build_object('cancelled_intents', to_jsonb(array_agg(c.id ORDER BY c.id))) AS detail
          FROM cancelled c GROUP BY c.campaign_id
    )
    INSERT INTO ledger.campaign_event (campaign_id, seq, type, actor, generation, payload, created_at)
    SELECT ch.id, ch.event_seq, 'transition',
           CASE WHEN v_name = 'record_attempt' THEN coalesce(ch.old_owner, v_actor) ELSE v_actor END,
           ch.generation,
           CASE WHEN v_name = 'record_attempt'
                THEN jsonb_build_object('attempt_no', a.attempt_no, 'fingerprint', a.fingerprint,
                                        'candidate_sha', a.candidate_sha, 'base_sha', a.base_sha)
                ELSE v_detail END
             || coalesce(cb.detail, '{}')
             || jsonb_build_object('transition', v_name, 'from', ch.from_state, 'to', ch.to_state,
                                   'attempt_count', ch.attempt_count),
           ledger.now()
      FROM changed ch
      LEFT JOIN cancelled_by cb ON cb.campaign_id = ch.id
      LEFT JOIN ledger.attempt a
             ON v_name = 'record_attempt' AND a.campaign_id = ch.id AND a.generation = ch.old_generation;
    -- Hints only, as in campaign_journal.
    PERFORM pg_notify(h.channel, h.id::text)
       FROM (SELECT 'ledger_event' AS channel, n.id
               FROM batch_old o JOIN batch_new n ON n.id = o.id
              WHERE n.state NOT IN ('leased', 'attempted') AND o.state IS DISTINCT FROM n.state
             UNION ALL
             SELECT 'ledger_ready', n.id
               FROM batch_old o JOIN batch_new n ON n.id = o.id
              WHERE n.state = 'ready' AND o.state IS DISTINCT FROM n.state
             UNION ALL
             SELECT 'ledger_cancel', n.id
               FROM batch_old o JOIN batch_new n ON n.id = o.id
              WHERE o.state = 'leased' AND n.state <> 'attempted' AND n.generation > o.generation) h;
    RETURN NULL;
END
$$;

-- (Every UPDATE of campaign fills the two transition tables, batch or not:
-- PostgreSQL captures them before any WHEN is tested. For a one-row update
-- that is two tuples copied to memory: below what bench's rowcost section
-- can tell from noise on the shared machine; see bench/README.md.)
CREATE OR REPLACE TRIGGER campaign_journal_batch AFTER UPDATE ON ledger.campaign
    REFERENCING OLD TABLE AS batch_old NEW TABLE AS batch_new
    FOR EACH STATEMENT
    WHEN (pg_catalog.current_setting('ledger.batch', true) = 'on')
    EXECUTE FUNCTION ledger.campaign_journal_batch();
