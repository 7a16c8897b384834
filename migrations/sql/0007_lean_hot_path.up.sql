-- 0007 lean hot path, and batch claims
--
-- Measured with bench/ (python -m bench): a claim+record cycle cost ~3x the
-- server CPU of the raw-SQL limit. The invariants stay where they were; what
-- changes is what they cost:
--
-- * The clock and the transition declarations are called several times per
--   write. As plpgsql with a function-level SET search_path each call pushed
--   and popped a GUC and invalidated the cached search path. ledger.now() is
--   now an inlinable SQL expression (the pinnable-clock check moves into a
--   helper that only runs when a pin is set); begin/end_transition make one
--   statement of their four settings. (As SQL functions they were slower:
--   called from plpgsql, a SQL function is planned on every call.)
--   Internal helpers and triggers inherit the pinned search_path of the
--   SECURITY DEFINER function that calls them (runtime roles cannot call them
--   or write the tables directly) and name everything schema-qualified, so
--   they no longer pin their own.
-- * campaign.state no longer references ledger.state (a row lock per state
--   change, see below); the guard trigger holds that invariant.
-- * A recorded attempt hints verifiers and tails after its commit, not in it
--   (see below): NOTIFY serialises commits.
-- * The journal's NOTIFY trigger is per row with a WHEN clause, so a claim's
--   journal event (which wakes nobody) never enters plpgsql.
--
-- And two calls for fleets that drain many small campaigns:
--   claim_campaigns(worker, classes, limit)  up to `limit` leases in one
--       statement, each its own generation, lease and attempt row;
--   record_attempts(attempts jsonb)          many candidates in one call; a
--       stale item is reported, not raised, so one reaped lease does not
--       throw away the batch.

------------------------------------------------------------------------------
-- The clock
------------------------------------------------------------------------------

CREATE FUNCTION ledger.pinned_now(p_pinned text) RETURNS timestamptz
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF (SELECT value = 'true' FROM ledger.meta WHERE key = 'clock_pinnable') THEN
        RETURN p_pinned::timestamptz;
    END IF;
    RETURN statement_timestamp();
END
$$;
REVOKE ALL ON FUNCTION ledger.pinned_now(text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION ledger.now() RETURNS timestamptz
    LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN COALESCE(pg_catalog.current_setting('ledger.now', true), '') = ''
                THEN pg_catalog.statement_timestamp()
                ELSE ledger.pinned_now(pg_catalog.current_setting('ledger.now', true)) END
$$;

------------------------------------------------------------------------------
-- Transition declarations
------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION ledger.begin_transition(p_name text, p_role text, p_actor text,
                                                   p_detail jsonb DEFAULT '{}')
    RETURNS void
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_catalog.set_config('ledger.transition', p_name, true),
            pg_catalog.set_config('ledger.actor_role', p_role, true),
            pg_catalog.set_config('ledger.actor', coalesce(p_actor, p_role), true),
            pg_catalog.set_config('ledger.detail', coalesce(p_detail, '{}'::jsonb)::text, true);
END
$$;

CREATE OR REPLACE FUNCTION ledger.end_transition() RETURNS void
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_catalog.set_config('ledger.transition', '', true),
            pg_catalog.set_config('ledger.actor_role', '', true),
            pg_catalog.set_config('ledger.detail', '', true);
END
$$;

------------------------------------------------------------------------------
-- Hints for recorded attempts leave the write's transaction
------------------------------------------------------------------------------

-- PostgreSQL serialises the commits of transactions that NOTIFY, WAL flush
-- included; with a NOTIFY in every record_attempt, concurrent workers queued
-- on that lock (Lock:object was most of their wait samples) and a fleet could
-- record one attempt per WAL flush. Recorded attempts are the one high-rate
-- write whose waiters (verifiers, tails) are hinted, so Ledger's client sends
-- those two hints right after the commit instead (Session.hint), where the
-- serialised part costs microseconds. Everything else still signals inside
-- its transaction: opens, returns to ready, cancels, journal appends, outbox.
CREATE OR REPLACE FUNCTION ledger.campaign_journal() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    v_from text := CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END;
    v_name text := current_setting('ledger.transition', true);
    v_detail jsonb := coalesce(nullif(current_setting('ledger.detail', true), '')::jsonb, '{}');
    v_actor text := coalesce(nullif(current_setting('ledger.actor', true), ''), 'system');
BEGIN
    IF v_name = 'record_attempt' THEN
        -- The event describes the attempt it records, read from the row this
        -- transaction just ended, by the lease holder it was recorded for:
        -- so one UPDATE can record a whole batch (record_attempts).
        SELECT jsonb_build_object('attempt_no', a.attempt_no, 'fingerprint', a.fingerprint,
                                  'candidate_sha', a.candidate_sha, 'base_sha', a.base_sha)
          INTO v_detail
          FROM ledger.attempt a WHERE a.campaign_id = NEW.id AND a.generation = OLD.generation;
        v_actor := coalesce(OLD.lease_owner, v_actor);
    END IF;
    INSERT INTO ledger.campaign_event (campaign_id, seq, type, actor, generation, payload, created_at)
    VALUES (NEW.id, NEW.event_seq, 'transition', v_actor,
            NEW.generation,
            v_detail || jsonb_build_object(
                'transition', v_name,
                'from', v_from, 'to', NEW.state,
                'attempt_count', NEW.attempt_count),
            ledger.now());
    -- Hints only (mechanism 5); payloads are ids.
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

-- Per row now, filtered by WHEN before any plpgsql runs; PostgreSQL folds
-- identical notifications of one transaction into one, so a batch of appends
-- to one campaign still sends one hint. (The statement trigger with a
-- transition table made every journal insert fill a tuplestore.)
DROP TRIGGER campaign_event_notify ON ledger.campaign_event;
DROP FUNCTION ledger.journal_notify();
CREATE FUNCTION ledger.journal_notify() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_notify('ledger_event', NEW.campaign_id::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER campaign_event_notify AFTER INSERT ON ledger.campaign_event
    FOR EACH ROW
    WHEN (NOT (NEW.type = 'transition' AND NEW.payload ->> 'to' IN ('leased', 'attempted')))
    EXECUTE FUNCTION ledger.journal_notify();

-- The guard made up to three lookups per state change (is the old state
-- terminal, which transition is this, is the new state terminal); one query
-- now answers all three.
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

    IF NEW.state IS DISTINCT FROM OLD.state THEN
        SELECT so.is_terminal, sn.is_terminal, t.owner_role, t.name IS NOT NULL
          INTO v_old_terminal, v_new_terminal, v_owner, v_known
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
        NEW.event_seq := OLD.event_seq + 1;
        IF v_new_terminal THEN
            NEW.closed_at := v_now;
        END IF;
    END IF;
    NEW.updated_at := v_now;
    RETURN NEW;
END
$$;

ALTER FUNCTION ledger.attempt_guard() RESET search_path;
ALTER FUNCTION ledger.append_event(bigint, text, text, jsonb, boolean) RESET search_path;

------------------------------------------------------------------------------
-- States without a row lock per change
------------------------------------------------------------------------------

-- campaign.state referenced ledger.state, so every state change took a KEY
-- SHARE lock on one of eight rows: concurrent writers piled multixacts and
-- WAL-logged lock records onto one heap page. A CHECK listing the eight
-- names was no better: PostgreSQL re-reads a table's CHECK expressions from
-- their stored text on every INSERT and UPDATE, and that one was the longest
-- (perf: ExecConstraints -> stringToNode, ~4 % of a cycle). The guard
-- trigger already admits only the to_state of a declared transition, and
-- ledger.transition's columns reference ledger.state: that is the invariant,
-- in the schema, at no extra cost.
ALTER TABLE ledger.campaign DROP CONSTRAINT campaign_state_fkey;

------------------------------------------------------------------------------
-- The two calls of every attempt, with fewer statements
------------------------------------------------------------------------------

-- claim_campaign and record_attempt as in 0004, but the attempt number is
-- computed inside its INSERT, and record_attempt leaves its event's details
-- to the journal trigger, which reads them from the attempt row.
CREATE OR REPLACE FUNCTION ledger_api.claim_campaign(p_worker text, p_classes text[] DEFAULT NULL)
    RETURNS TABLE (campaign_id bigint, generation bigint, attempt_no integer,
                   lease_expires_at timestamptz, class text, objective_key text, target text,
                   desired_state jsonb, opening_observation jsonb, acceptance_criteria jsonb,
                   attempt_count integer, max_attempts integer)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
    v_attempt_no integer;
BEGIN
    IF p_worker IS NULL OR length(p_worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'worker identity must be 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    FOR i IN 1..3 LOOP
        BEGIN
            PERFORM ledger.begin_transition('claim', 'worker', p_worker);
            UPDATE ledger.campaign c
               SET state = 'leased',
                   generation = c.generation + 1,
                   lease_owner = p_worker,
                   leased_at = v_now,
                   lease_expires_at = v_now + make_interval(secs => (
                       SELECT cc.lease_seconds FROM ledger.campaign_class cc WHERE cc.name = c.class))
             WHERE c.id = (
                   SELECT r.id FROM ledger.campaign r
                    WHERE r.state = 'ready'
                      AND r.next_attempt_at <= v_now
                      AND (p_classes IS NULL OR r.class = ANY (p_classes))
                      AND (r.seat IS NULL OR NOT EXISTS (
                               SELECT 1 FROM ledger.campaign s
                                WHERE s.seat = r.seat AND s.state = 'leased'))
                    ORDER BY r.priority DESC, r.created_at, r.id
                    LIMIT 1
                      -- NO KEY UPDATE is all this UPDATE needs (no key column
                      -- changes), and unlike FOR UPDATE it does not conflict
                      -- with the key-share locks every journal and attempt
                      -- insert takes on its campaign through the foreign key;
                      -- FOR UPDATE would make SKIP LOCKED wait while it walks
                      -- a row's update chain.
                      FOR NO KEY UPDATE SKIP LOCKED)
            RETURNING c.* INTO v_c;
            EXIT;
        EXCEPTION WHEN unique_violation THEN
            -- another worker leased a campaign of the same seat a moment ago
            v_c := NULL;
        END;
    END LOOP;
    PERFORM ledger.end_transition();
    IF v_c.id IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO ledger.attempt (campaign_id, attempt_no, generation, worker, claimed_at, lease_expires_at)
    SELECT v_c.id, coalesce(max(a.attempt_no), 0) + 1, v_c.generation, p_worker, v_now, v_c.lease_expires_at
      FROM ledger.attempt a WHERE a.campaign_id = v_c.id
    RETURNING attempt.attempt_no INTO v_attempt_no;
    RETURN QUERY SELECT v_c.id, v_c.generation, v_attempt_no, v_c.lease_expires_at, v_c.class,
                        v_c.objective_key, v_c.target, v_c.desired_state, v_c.opening_observation,
                        v_c.acceptance_criteria, v_c.attempt_count, v_c.max_attempts;
END
$$;

CREATE OR REPLACE FUNCTION ledger_api.record_attempt(
        p_campaign_id bigint, p_generation bigint, p_base_sha text, p_candidate_sha text,
        p_fingerprint text, p_bundle jsonb DEFAULT NULL, p_bundle_digest text DEFAULT NULL,
        p_evidence_location text DEFAULT NULL, p_log_tail text DEFAULT NULL)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
    v_attempt_no integer;
BEGIN
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id FOR UPDATE;
    IF NOT FOUND OR v_c.generation <> p_generation OR v_c.state <> 'leased' THEN
        PERFORM ledger.raise_stale(p_campaign_id, p_generation);
    END IF;
    IF p_fingerprint IS NULL OR p_fingerprint !~ '^[A-Za-z0-9:_.-]{8,200}$' THEN
        RAISE EXCEPTION 'an attempt needs a fingerprint (8-200 characters of [A-Za-z0-9:_.-])'
            USING ERRCODE = 'LG007';
    END IF;
    IF p_candidate_sha IS NULL OR p_candidate_sha !~ '^[0-9a-f]{7,64}$'
       OR (p_base_sha IS NOT NULL AND p_base_sha !~ '^[0-9a-f]{7,64}$') THEN
        RAISE EXCEPTION 'candidate and base must be hexadecimal commit ids' USING ERRCODE = 'LG007';
    END IF;
    IF EXISTS (SELECT 1 FROM ledger.attempt a
                WHERE a.campaign_id = p_campaign_id AND a.fingerprint = p_fingerprint
                  AND (a.outcome = 'failed' OR a.verdict = 'rejected')) THEN
        RAISE EXCEPTION 'the next attempt must differ: approach % already failed on campaign %',
            p_fingerprint, p_campaign_id USING ERRCODE = 'LG006';
    END IF;
    UPDATE ledger.attempt a
       SET outcome = 'attempted', ended_at = v_now, fingerprint = p_fingerprint,
           base_sha = p_base_sha, candidate_sha = p_candidate_sha, bundle = p_bundle,
           bundle_digest = p_bundle_digest, log_tail = p_log_tail
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation
    RETURNING a.attempt_no INTO v_attempt_no;
    -- (The journal trigger describes the attempt from its row.)
    PERFORM ledger.begin_transition('record_attempt', 'worker', v_c.lease_owner);
    UPDATE ledger.campaign c
       SET state = 'attempted', lease_owner = NULL, leased_at = NULL, lease_expires_at = NULL,
           attempt_count = c.attempt_count + 1,
           evidence_location = coalesce(p_evidence_location, c.evidence_location),
           last_failure_reason = NULL
     WHERE c.id = p_campaign_id;
    PERFORM ledger.end_transition();
    RETURN v_attempt_no;
END
$$;

------------------------------------------------------------------------------
-- Batch claim and batch record
------------------------------------------------------------------------------

-- Up to p_limit ready campaigns in one statement. Same eligibility and order
-- as claim_campaign; at most one campaign per seat per batch (the unique
-- index would refuse a second lease on a seat anyway). Candidates it locked
-- but left out stay locked only until this statement's transaction ends.
CREATE FUNCTION ledger_api.claim_campaigns(p_worker text, p_classes text[] DEFAULT NULL,
                                           p_limit integer DEFAULT 10)
    RETURNS TABLE (campaign_id bigint, generation bigint, attempt_no integer,
                   lease_expires_at timestamptz, class text, objective_key text, target text,
                   desired_state jsonb, opening_observation jsonb, acceptance_criteria jsonb,
                   attempt_count integer, max_attempts integer)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_ids bigint[] := '{}';
BEGIN
    IF p_worker IS NULL OR length(p_worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'worker identity must be 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'a batch claims 1 to 1000 campaigns' USING ERRCODE = 'LG007';
    END IF;
    FOR i IN 1..3 LOOP
        BEGIN
            PERFORM ledger.begin_transition('claim', 'worker', p_worker);
            WITH picked AS (
                -- twice the batch, so campaigns that share a seat with a
                -- better one can be left out and the batch still fills
                SELECT r.id, r.seat, r.priority, r.created_at FROM ledger.campaign r
                 WHERE r.state = 'ready'
                   AND r.next_attempt_at <= v_now
                   AND (p_classes IS NULL OR r.class = ANY (p_classes))
                   AND (r.seat IS NULL OR NOT EXISTS (
                            SELECT 1 FROM ledger.campaign s
                             WHERE s.seat = r.seat AND s.state = 'leased'))
                 ORDER BY r.priority DESC, r.created_at, r.id
                 LIMIT 2 * p_limit
                   FOR NO KEY UPDATE SKIP LOCKED
            ), one_per_seat AS (
                SELECT p.id FROM (SELECT p.*, row_number() OVER (
                                      PARTITION BY coalesce(p.seat, p.id::text)
                                      ORDER BY p.priority DESC, p.created_at, p.id) AS n
                                    FROM picked p) p
                 WHERE p.n = 1
                 ORDER BY p.priority DESC, p.created_at, p.id
                 LIMIT p_limit
            ), leased AS (
                UPDATE ledger.campaign c
                   SET state = 'leased',
                       generation = c.generation + 1,
                       lease_owner = p_worker,
                       leased_at = v_now,
                       lease_expires_at = v_now + make_interval(secs => cc.lease_seconds)
                  FROM one_per_seat o, ledger.campaign_class cc
                 WHERE c.id = o.id AND cc.name = c.class
                RETURNING c.id, c.generation, c.lease_expires_at
            ), started AS (
                INSERT INTO ledger.attempt (campaign_id, attempt_no, generation, worker,
                                            claimed_at, lease_expires_at)
                SELECT l.id, coalesce((SELECT max(a.attempt_no) FROM ledger.attempt a
                                        WHERE a.campaign_id = l.id), 0) + 1,
                       l.generation, p_worker, v_now, l.lease_expires_at
                  FROM leased l
                RETURNING attempt.campaign_id
            )
            SELECT coalesce(array_agg(s.campaign_id), '{}') INTO v_ids FROM started s;
            EXIT;
        EXCEPTION WHEN unique_violation THEN
            v_ids := '{}';  -- a seat was leased by another worker a moment ago: try again
        END;
    END LOOP;
    PERFORM ledger.end_transition();
    RETURN QUERY
    SELECT c.id, c.generation, a.attempt_no, c.lease_expires_at, c.class, c.objective_key,
           c.target, c.desired_state, c.opening_observation, c.acceptance_criteria,
           c.attempt_count, c.max_attempts
      FROM ledger.campaign c
      JOIN ledger.attempt a ON a.campaign_id = c.id AND a.generation = c.generation
     WHERE c.id = ANY (v_ids)
     ORDER BY c.priority DESC, c.created_at, c.id;
END
$$;

-- Record many candidates: p_attempts is a JSON array of objects with
-- campaign_id, generation, candidate_sha, fingerprint and optionally
-- base_sha, bundle, bundle_digest, evidence_location, log_tail. Returns one
-- row per item: 'recorded' with its attempt number, or 'stale' (the lease was
-- lost: stand down for that one). Bad input fails the whole call (LG007), and
-- a repeated failed approach too (LG006), as with record_attempt.
CREATE FUNCTION ledger_api.record_attempts(p_attempts jsonb)
    RETURNS TABLE (campaign_id bigint, generation bigint, status text, attempt_no integer)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_ids bigint[];
BEGIN
    IF p_attempts IS NULL OR jsonb_typeof(p_attempts) <> 'array'
       OR jsonb_array_length(p_attempts) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'record_attempts takes a JSON array of 1 to 1000 attempts' USING ERRCODE = 'LG007';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_attempts) AS i(fingerprint text)
                WHERE coalesce(i.fingerprint, '') !~ '^[A-Za-z0-9:_.-]{8,200}$') THEN
        RAISE EXCEPTION 'an attempt needs a fingerprint (8-200 characters of [A-Za-z0-9:_.-])'
            USING ERRCODE = 'LG007';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_attempts)
                             AS i(campaign_id bigint, generation bigint, candidate_sha text, base_sha text)
                WHERE coalesce(i.candidate_sha, '') !~ '^[0-9a-f]{7,64}$' OR i.base_sha !~ '^[0-9a-f]{7,64}$'
                   OR i.campaign_id IS NULL OR i.generation IS NULL) THEN
        RAISE EXCEPTION 'each attempt needs campaign_id, generation and hexadecimal commit ids'
            USING ERRCODE = 'LG007';
    END IF;
    -- Lock the live leases, in id order as every writer of several campaigns does.
    SELECT coalesce(array_agg(l.id), '{}') INTO v_ids
      FROM (SELECT c.id FROM ledger.campaign c
              JOIN jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, generation bigint)
                ON i.campaign_id = c.id AND i.generation = c.generation
             WHERE c.state = 'leased'
             ORDER BY c.id FOR NO KEY UPDATE OF c) l;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, fingerprint text)
                 JOIN ledger.attempt a ON a.campaign_id = i.campaign_id AND a.fingerprint = i.fingerprint
                WHERE i.campaign_id = ANY (v_ids) AND (a.outcome = 'failed' OR a.verdict = 'rejected')) THEN
        RAISE EXCEPTION 'the next attempt must differ: an approach in this batch already failed on its campaign'
            USING ERRCODE = 'LG006';
    END IF;
    UPDATE ledger.attempt a
       SET outcome = 'attempted', ended_at = v_now, fingerprint = i.fingerprint,
           base_sha = i.base_sha, candidate_sha = i.candidate_sha, bundle = i.bundle,
           bundle_digest = i.bundle_digest, log_tail = i.log_tail
      FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, generation bigint, candidate_sha text,
               fingerprint text, base_sha text, bundle jsonb, bundle_digest text, log_tail text)
     WHERE i.campaign_id = ANY (v_ids) AND a.campaign_id = i.campaign_id AND a.generation = i.generation;
    -- One UPDATE for the batch: the journal trigger reads each event's
    -- details and lease holder from that campaign's own rows.
    PERFORM ledger.begin_transition('record_attempt', 'worker', NULL);
    UPDATE ledger.campaign c
       SET state = 'attempted', lease_owner = NULL, leased_at = NULL, lease_expires_at = NULL,
           attempt_count = c.attempt_count + 1,
           evidence_location = coalesce(i.evidence_location, c.evidence_location),
           last_failure_reason = NULL
      FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, evidence_location text)
     WHERE c.id = i.campaign_id AND c.id = ANY (v_ids);
    PERFORM ledger.end_transition();
    RETURN QUERY
    SELECT i.campaign_id, i.generation,
           CASE WHEN i.campaign_id = ANY (v_ids) THEN 'recorded' ELSE 'stale' END,
           CASE WHEN i.campaign_id = ANY (v_ids) THEN a.attempt_no END
      FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, generation bigint)
      LEFT JOIN ledger.attempt a ON a.campaign_id = i.campaign_id AND a.generation = i.generation
     ORDER BY i.campaign_id;
END
$$;

DO $$
BEGIN
    REVOKE ALL ON FUNCTION ledger_api.claim_campaigns(text, text[], integer) FROM PUBLIC;
    REVOKE ALL ON FUNCTION ledger_api.record_attempts(jsonb) FROM PUBLIC;
    EXECUTE format('GRANT EXECUTE ON FUNCTION ledger_api.claim_campaigns(text, text[], integer) TO %I',
                   ledger.role_name('worker'));
    EXECUTE format('GRANT EXECUTE ON FUNCTION ledger_api.record_attempts(jsonb) TO %I',
                   ledger.role_name('worker'));
END
$$;
