-- 0007 down: batch calls gone, the state foreign key and the pinned helpers back.
DROP FUNCTION IF EXISTS ledger_api.record_attempts(jsonb);
DROP FUNCTION IF EXISTS ledger_api.claim_campaigns(text, text[], integer);

ALTER TABLE ledger.campaign ADD CONSTRAINT campaign_state_fkey
    FOREIGN KEY (state) REFERENCES ledger.state (name);

-- The two kernel calls back to their 0004 text.
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
    SELECT coalesce(max(a.attempt_no), 0) + 1 INTO v_attempt_no
      FROM ledger.attempt a WHERE a.campaign_id = v_c.id;
    INSERT INTO ledger.attempt (campaign_id, attempt_no, generation, worker, claimed_at, lease_expires_at)
    VALUES (v_c.id, v_attempt_no, v_c.generation, p_worker, v_now, v_c.lease_expires_at);
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
    PERFORM ledger.begin_transition('record_attempt', 'worker', v_c.lease_owner,
                jsonb_build_object('attempt_no', v_attempt_no, 'fingerprint', p_fingerprint,
                                   'candidate_sha', p_candidate_sha, 'base_sha', p_base_sha));
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

CREATE OR REPLACE FUNCTION ledger.campaign_guard() RETURNS trigger
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

CREATE OR REPLACE FUNCTION ledger.campaign_journal() RETURNS trigger
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
    IF NEW.state = 'ready' THEN
        PERFORM pg_notify('ledger_ready', NEW.id::text);
    ELSIF NEW.state = 'attempted' THEN
        PERFORM pg_notify('ledger_attempted', NEW.id::text);
    END IF;
    IF v_from = 'leased' AND NEW.state <> 'attempted' AND NEW.generation > OLD.generation THEN
        PERFORM pg_notify('ledger_cancel', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER campaign_event_notify ON ledger.campaign_event;
DROP FUNCTION ledger.journal_notify();
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
ALTER FUNCTION ledger.attempt_guard() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION ledger.append_event(bigint, text, text, jsonb, boolean) SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION ledger.begin_transition(p_name text, p_role text, p_actor text,
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

CREATE OR REPLACE FUNCTION ledger.end_transition() RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM set_config('ledger.transition', '', true);
    PERFORM set_config('ledger.actor_role', '', true);
    PERFORM set_config('ledger.detail', '', true);
END
$$;

CREATE OR REPLACE FUNCTION ledger.now() RETURNS timestamptz
    LANGUAGE plpgsql STABLE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    pinned text := current_setting('ledger.now', true);
BEGIN
    IF pinned IS NOT NULL AND pinned <> ''
       AND (SELECT value = 'true' FROM ledger.meta WHERE key = 'clock_pinnable') THEN
        RETURN pinned::timestamptz;
    END IF;
    RETURN statement_timestamp();
END
$$;

DROP FUNCTION IF EXISTS ledger.pinned_now(text);
