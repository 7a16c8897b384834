-- The worker's API: claims, heartbeats, endings, journal appends, side-effect requests

-- SECURITY DEFINER, pinned search_path, names schema-qualified; grants.sql
-- grants each to this one role. SQLSTATEs: see api_helpers.sql.

-- Claims are fair across classes: a class with a large backlog cannot starve
-- another. Each claim takes a turn (the ledger.claim_turn sequence) in a
-- weighted rotation over the classes that have ready work, ordered by name,
-- each holding campaign_class.weight consecutive turns; the claim then takes
-- the head of that class (priority, then age), or of the next class in the
-- rotation if that one has nothing it can lease. Priority orders campaigns
-- within a class; across classes the weights decide. With two classes of
-- weight 1, every other claim goes to each while both have work.
--
-- The rotation, starting at the class whose turn it is: an empty array if no
-- class has ready work. One probe per registered class (the head of its
-- claim_order range), so its cost follows the number of classes, not of
-- campaigns; a worker serving one class named skips it (see the callers).
CREATE OR REPLACE FUNCTION ledger.claim_turns(p_classes text[], p_now timestamptz)
    RETURNS text[]
    LANGUAGE plpgsql
AS $$
DECLARE
    v_names text[];
    v_weights integer[];
    v_slot bigint;
    v_first integer := 1;
BEGIN
    SELECT array_agg(cc.name ORDER BY cc.name), array_agg(cc.weight ORDER BY cc.name)
      INTO v_names, v_weights
      FROM ledger.campaign_class cc
     WHERE (p_classes IS NULL OR cc.name = ANY (p_classes))
       AND cc.paused_at IS NULL  -- a paused class takes no turn (pause_class)
       -- the head in claim order, LIMIT 1: an EXISTS would drop the order
       -- and let the planner AND two bitmaps over the whole ready backlog
       AND (SELECT true FROM ledger.campaign r
             WHERE r.class = cc.name AND r.state = 'ready' AND r.next_attempt_at <= p_now
             ORDER BY r.priority DESC, r.created_at, r.id LIMIT 1);
    IF coalesce(cardinality(v_names), 0) <= 1 THEN
        RETURN coalesce(v_names, '{}');  -- no choice to make: no turn taken
    END IF;
    v_slot := nextval('ledger.claim_turn') % (SELECT sum(w) FROM unnest(v_weights) w);
    WHILE v_slot >= v_weights[v_first] LOOP
        v_slot := v_slot - v_weights[v_first];
        v_first := v_first + 1;
    END LOOP;
    RETURN v_names[v_first:] || v_names[:v_first - 1];
END
$$;

-- Claim the next ready campaign in one statement: SKIP LOCKED, next_attempt_at
-- honoured, the class whose turn it is (above), then priority and age within
-- it, one lease per seat. Bumps the generation. Says how long the lease is by
-- the database's clock (lease_remaining_s), so the holder can keep its own
-- deadline (ledger.lease).
--
-- Planned once (plan_cache_mode): with classes of different sizes the plan
-- cache's custom plans for each class never looked dearer than its generic
-- one, so the claim was planned again on every call (bench/cost: 330 us of
-- planning per claim with 13 classes, more than its execution); the generic
-- plan is the same probe of campaign_claim_order (tests/test_claim_plan.py).
CREATE OR REPLACE FUNCTION ledger_api.claim_campaign(p_worker text, p_classes text[] DEFAULT NULL)
    RETURNS TABLE (campaign_id bigint, generation bigint, attempt_no integer,
                   lease_expires_at timestamptz, class text, objective_key text, target text,
                   desired_state jsonb, opening_observation jsonb, acceptance_criteria jsonb,
                   attempt_count integer, max_attempts integer, lease_remaining_s double precision)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
    v_attempt_no integer;
    v_turns text[];
    v_class text;
    v_fair text;
    v_key text;
    v_resources text[];
BEGIN
    IF p_worker IS NULL OR length(p_worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'worker identity must be 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    -- one class named: nothing to share
    v_turns := CASE WHEN cardinality(p_classes) = 1 THEN p_classes
                    ELSE ledger.claim_turns(p_classes, v_now) END;
    FOR i IN 1..3 LOOP
        BEGIN
            PERFORM ledger.begin_transition('claim', 'worker', p_worker);
            FOREACH v_class IN ARRAY v_turns LOOP
                SELECT cc.fair_key, cc.resources INTO v_fair, v_resources
                  FROM ledger.campaign_class cc WHERE cc.name = v_class;
                IF cardinality(v_resources) > 0 AND NOT ledger.buckets_open(v_resources, v_now) THEN
                    CONTINUE;  -- its rate bucket is empty: none of its campaigns can start now
                END IF;
                IF v_fair IS NOT NULL THEN
                    -- fair across its keys (limits.sql): the key with the
                    -- fewest leases for its weight first, each key's head
                    FOR v_key IN SELECT fk.fair_key FROM ledger.fair_keys(v_class) fk LOOP
                        UPDATE ledger.campaign c
                           SET state = 'leased',
                               generation = c.generation + 1,
                               lease_owner = p_worker,
                               leased_at = v_now,
                               lease_expires_at = v_now + make_interval(secs => (
                                   SELECT cc.lease_seconds FROM ledger.campaign_class cc WHERE cc.name = c.class))
                         WHERE c.id = (
                               SELECT r.id FROM ledger.campaign r
                                WHERE r.class = v_class AND r.fair_key = v_key
                                  AND NOT EXISTS (SELECT 1 FROM ledger.campaign_class p  -- paused: skipped
                                                   WHERE p.name = v_class AND p.paused_at IS NOT NULL)
                                  AND r.state = 'ready'
                                  AND r.next_attempt_at <= v_now
                                  AND (r.seat IS NULL OR NOT EXISTS (
                                           SELECT 1 FROM ledger.campaign s
                                            WHERE s.seat = r.seat AND s.state = 'leased'))
                                  -- limits, as below
                                  AND (r.limit_keys = '{}' OR ledger.limits_open(r.limit_keys, '{}', v_now))
                                  AND (r.max_cost IS NULL OR r.cost_spent < r.max_cost)
                                ORDER BY r.priority DESC, r.created_at, r.id
                                LIMIT 1
                                  -- (NO KEY UPDATE: see below)
                                  FOR NO KEY UPDATE SKIP LOCKED)
                        RETURNING c.* INTO v_c;
                        EXIT WHEN FOUND;
                    END LOOP;
                    EXIT WHEN v_c.id IS NOT NULL;
                    CONTINUE;
                END IF;
                UPDATE ledger.campaign c
                   SET state = 'leased',
                       generation = c.generation + 1,
                       lease_owner = p_worker,
                       leased_at = v_now,
                       lease_expires_at = v_now + make_interval(secs => (
                           SELECT cc.lease_seconds FROM ledger.campaign_class cc WHERE cc.name = c.class))
                 WHERE c.id = (
                       SELECT r.id FROM ledger.campaign r
                        WHERE r.class = v_class
                          AND NOT EXISTS (SELECT 1 FROM ledger.campaign_class p  -- paused: skipped
                                           WHERE p.name = v_class AND p.paused_at IS NOT NULL)
                          AND r.state = 'ready'
                          AND r.next_attempt_at <= v_now
                          AND (r.seat IS NULL OR NOT EXISTS (
                                   SELECT 1 FROM ledger.campaign s
                                    WHERE s.seat = r.seat AND s.state = 'leased'))
                          -- limits (limits.sql): no key at its cap or over
                          -- today's budget (its class's buckets are tested
                          -- above, once), its own budget not spent; taking
                          -- the slots in the trigger makes it atomic. (An
                          -- equality the column's statistics answer, not
                          -- cardinality() = 0, whose default selectivity made
                          -- the planner leave campaign_claim_order.)
                          AND (r.limit_keys = '{}' OR ledger.limits_open(r.limit_keys, '{}', v_now))
                          AND (r.max_cost IS NULL OR r.cost_spent < r.max_cost)
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
                EXIT WHEN FOUND;
            END LOOP;
            EXIT;
        EXCEPTION WHEN unique_violation OR SQLSTATE 'LG014' THEN
            -- another worker leased a campaign of the same seat a moment ago,
            -- or took the last slot of one of its keys (limits.sql)
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
                        v_c.acceptance_criteria, v_c.attempt_count, v_c.max_attempts,
                        extract(epoch FROM v_c.lease_expires_at - v_now)::double precision;
END
$$;

-- Up to p_limit ready campaigns in one statement. Same eligibility as
-- claim_campaign, and as fair: each class in the rotation offers its heads
-- (priority, then age), and the batch interleaves them by weight (the k-th
-- head of a class of weight w ranks at (k - 1) / w, ties in rotation
-- order), so two classes of weight 1 split a batch evenly while both have
-- work. At most one campaign per seat per batch (the unique index would
-- refuse a second lease on a seat anyway). Candidates it locked but left out
-- stay locked only until this statement's transaction ends.
CREATE OR REPLACE FUNCTION ledger_api.claim_campaigns(p_worker text, p_classes text[] DEFAULT NULL,
                                           p_limit integer DEFAULT 10)
    RETURNS TABLE (campaign_id bigint, generation bigint, attempt_no integer,
                   lease_expires_at timestamptz, class text, objective_key text, target text,
                   desired_state jsonb, opening_observation jsonb, acceptance_criteria jsonb,
                   attempt_count integer, max_attempts integer, lease_remaining_s double precision)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_ids bigint[] := '{}';
    v_turns text[];
BEGIN
    IF p_worker IS NULL OR length(p_worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'worker identity must be 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'a batch claims 1 to 1000 campaigns' USING ERRCODE = 'LG007';
    END IF;
    v_turns := CASE WHEN cardinality(p_classes) = 1 THEN p_classes
                    ELSE ledger.claim_turns(p_classes, v_now) END;
    FOR i IN 1..3 LOOP
        BEGIN
            PERFORM ledger.begin_batch_transition('claim', 'worker', p_worker);
            WITH turn AS (
                SELECT t.name, t.pos, cc.weight, cc.fair_key
                  FROM unnest(v_turns) WITH ORDINALITY AS t(name, pos)
                  JOIN ledger.campaign_class cc ON cc.name = t.name
                 WHERE cc.paused_at IS NULL  -- a paused class is skipped (pause_class)
                   -- so is one whose rate bucket is empty (limits.sql)
                   AND (cardinality(cc.resources) = 0 OR ledger.buckets_open(cc.resources, v_now))
            ), picked AS (
                -- the batch per class and up to ten more, so that campaigns
                -- sharing a seat with a better one can be left out and the
                -- batch still fill; no more than that: each row locked here
                -- is one every other claimer must skip (twice the batch cost
                -- eight claimers of 100 a fifth of their rate)
                SELECT h.id, h.seat, h.priority, h.created_at, turn.pos, turn.weight, h.limit_keys,
                       h.resources, NULL::double precision AS fair_rank
                  FROM turn CROSS JOIN LATERAL (
                       SELECT r.id, r.seat, r.priority, r.created_at, r.limit_keys, r.resources
                         FROM ledger.campaign r
                        WHERE r.class = turn.name
                          AND r.state = 'ready'
                          AND r.next_attempt_at <= v_now
                          AND (r.seat IS NULL OR NOT EXISTS (
                                   SELECT 1 FROM ledger.campaign s
                                    WHERE s.seat = r.seat AND s.state = 'leased'))
                          AND (r.limit_keys = '{}' OR ledger.limits_open(r.limit_keys, '{}', v_now))
                          AND (r.max_cost IS NULL OR r.cost_spent < r.max_cost)
                        ORDER BY r.priority DESC, r.created_at, r.id
                        LIMIT p_limit + least(p_limit, 10)
                          FOR NO KEY UPDATE SKIP LOCKED) h
                 WHERE turn.fair_key IS NULL
                UNION ALL
                -- a class fair across its keys (limits.sql): each key's heads,
                -- the k-th of a key of weight w ranked at (k - 1) / w, ties
                -- in ledger.fair_keys's order (fewest leases for the weight first)
                SELECT h.id, h.seat, h.priority, h.created_at, turn.pos, turn.weight, h.limit_keys,
                       h.resources, (h.k - 1)::double precision / fk.weight + fk.ord * 1e-6
                  FROM turn CROSS JOIN LATERAL ledger.fair_keys(turn.name) WITH ORDINALITY AS fk(key, weight, ord)
                 CROSS JOIN LATERAL (
                       SELECT x.*, row_number() OVER (ORDER BY x.priority DESC, x.created_at, x.id) AS k
                         FROM (SELECT r.id, r.seat, r.priority, r.created_at, r.limit_keys, r.resources
                                 FROM ledger.campaign r
                                WHERE r.class = turn.name AND r.fair_key = fk.key
                                  AND r.state = 'ready'
                                  AND r.next_attempt_at <= v_now
                                  AND (r.seat IS NULL OR NOT EXISTS (
                                           SELECT 1 FROM ledger.campaign s
                                            WHERE s.seat = r.seat AND s.state = 'leased'))
                                  AND (r.limit_keys = '{}' OR ledger.limits_open(r.limit_keys, '{}', v_now))
                                  AND (r.max_cost IS NULL OR r.cost_spent < r.max_cost)
                                ORDER BY r.priority DESC, r.created_at, r.id
                                LIMIT p_limit
                                  FOR NO KEY UPDATE SKIP LOCKED) x) h
                 WHERE turn.fair_key IS NOT NULL
            ), one_per_seat AS (
                SELECT p.id, p.pos, p.weight, p.limit_keys, p.resources,
                       row_number() OVER (PARTITION BY p.pos
                                          ORDER BY p.fair_rank NULLS FIRST, p.priority DESC, p.created_at,
                                                   p.id) AS k
                  FROM (SELECT p.*, row_number() OVER (
                                        PARTITION BY coalesce(p.seat, p.id::text)
                                        ORDER BY p.pos, p.priority DESC, p.created_at, p.id) AS n
                          FROM picked p) p
                 WHERE p.n = 1
            ), limited AS (
                -- limits (limits.sql): each capped key's candidates in the
                -- batch's order, so that no more are taken than it has room
                -- for, and one per rate-limited resource
                SELECT o.id, row_number() OVER (PARTITION BY u.key
                                                ORDER BY (o.k - 1)::double precision / o.weight, o.pos, o.id) AS n,
                       u.room
                  FROM one_per_seat o
                 CROSS JOIN LATERAL (
                       SELECT k.key, k.max_leased - ledger.leased_under(k.key) AS room FROM ledger.limit_key k
                        WHERE k.key = ANY (o.limit_keys) AND k.max_leased IS NOT NULL
                       UNION ALL
                       SELECT 'resource:' || b.resource, 1 FROM ledger.limit_bucket b
                        WHERE b.resource = ANY (o.resources) AND b.requests_per_minute IS NOT NULL) u
                 WHERE cardinality(o.limit_keys) > 0 OR cardinality(o.resources) > 0
            ), fair AS (
                SELECT o.id FROM one_per_seat o
                 WHERE NOT EXISTS (SELECT 1 FROM limited l WHERE l.id = o.id AND l.n > l.room)
                 ORDER BY (o.k - 1)::double precision / o.weight, o.pos
                 LIMIT p_limit
            ), leased AS (
                UPDATE ledger.campaign c
                   SET state = 'leased',
                       generation = c.generation + 1,
                       lease_owner = p_worker,
                       leased_at = v_now,
                       lease_expires_at = v_now + make_interval(secs => cc.lease_seconds)
                  FROM fair f, ledger.campaign_class cc
                 WHERE c.id = f.id AND cc.name = c.class
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
        EXCEPTION WHEN unique_violation OR SQLSTATE 'LG014' THEN
            v_ids := '{}';  -- a seat was leased by another worker a moment ago: try again
        END;
    END LOOP;
    PERFORM ledger.end_transition();
    RETURN QUERY
    SELECT c.id, c.generation, a.attempt_no, c.lease_expires_at, c.class, c.objective_key,
           c.target, c.desired_state, c.opening_observation, c.acceptance_criteria,
           c.attempt_count, c.max_attempts,
           extract(epoch FROM c.lease_expires_at - v_now)::double precision
      FROM ledger.campaign c
      JOIN ledger.attempt a ON a.campaign_id = c.id AND a.generation = c.generation
     WHERE c.id = ANY (v_ids)
     ORDER BY c.priority DESC, c.created_at, c.id;
END
$$;

-- Roll the lease forward, if it is still live: a heartbeat at or after the
-- expiry loses, reaped or not (LG001: stand down). Returns the new expiry and
-- the lease's length by the database's clock.
CREATE OR REPLACE FUNCTION ledger_api.heartbeat(p_campaign_id bigint, p_generation bigint)
    RETURNS TABLE (lease_expires_at timestamptz, lease_remaining_s double precision)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_expires timestamptz;
    v_lease double precision;
BEGIN
    PERFORM ledger.check_lease_args(p_campaign_id, p_generation);
    FOR i IN 1..2 LOOP
        UPDATE ledger.campaign c
           SET lease_expires_at = v_now + make_interval(secs => cc.lease_seconds)
          FROM ledger.campaign_class cc
         WHERE c.id = p_campaign_id AND c.generation = p_generation AND c.state = 'leased'
           AND c.lease_expires_at > v_now
           AND cc.name = c.class
        RETURNING c.lease_expires_at, cc.lease_seconds INTO v_expires, v_lease;
        -- not live: once more if the server just came back (ledger.restart_grace)
        EXIT WHEN FOUND OR i = 2 OR NOT ledger.restart_grace();
    END LOOP;
    IF v_expires IS NULL THEN
        PERFORM ledger.raise_stale(p_campaign_id, p_generation);
    END IF;
    UPDATE ledger.attempt a
       SET last_heartbeat_at = v_now, heartbeat_count = a.heartbeat_count + 1,
           lease_expires_at = v_expires
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
    RETURN QUERY SELECT v_expires, v_lease;
END
$$;

-- The attempt produced a candidate: leased -> attempted. Retrying the
-- identical record (same candidate and fingerprint) after it committed
-- returns its attempt number; anything else needs the live lease. The
-- candidate's evidence (bundle, diff, where it was published) is stored
-- here, in the database, for roles on other machines.
CREATE OR REPLACE FUNCTION ledger_api.record_attempt(
        p_campaign_id bigint, p_generation bigint, p_base_sha text, p_candidate_sha text,
        p_fingerprint text, p_bundle jsonb DEFAULT NULL, p_bundle_digest text DEFAULT NULL,
        p_evidence_location text DEFAULT NULL, p_log_tail text DEFAULT NULL,
        p_diff bytea DEFAULT NULL, p_candidate_ref text DEFAULT NULL)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign := ledger.lease_row(p_campaign_id, p_generation);
    v_a ledger.attempt;
    v_attempt_no integer;
BEGIN
    IF v_c.state IS DISTINCT FROM 'leased' OR v_c.generation <> p_generation
       OR v_c.lease_expires_at <= v_now THEN
        -- Not the live lease (the usual case skips this): this very ending
        -- retried after it committed, a lapsed lease the restart grace
        -- still covers (check_live renews it), or a stale holder (refused).
        SELECT * INTO v_a FROM ledger.attempt a
         WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
        IF v_a.outcome = 'attempted' AND v_a.candidate_sha = p_candidate_sha
           AND v_a.fingerprint = p_fingerprint THEN
            RETURN v_a.attempt_no;  -- this very ending, retried: it is in
        END IF;
        PERFORM ledger.check_live(v_c, p_generation);
    END IF;
    IF p_fingerprint IS NULL OR NOT ledger.is_fingerprint(p_fingerprint) THEN
        RAISE EXCEPTION 'an attempt needs a fingerprint (8-200 characters of [A-Za-z0-9:_.-])'
            USING ERRCODE = 'LG007';
    END IF;
    IF p_candidate_sha IS NULL OR NOT ledger.is_commit_sha(p_candidate_sha)
       OR (p_base_sha IS NOT NULL AND NOT ledger.is_commit_sha(p_base_sha)) THEN
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
           bundle_digest = p_bundle_digest, log_tail = p_log_tail, diff = p_diff,
           candidate_ref = p_candidate_ref
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation
    RETURNING a.attempt_no INTO v_attempt_no;
    -- The event describes the attempt it records, by the lease holder.
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

-- Record many candidates: p_attempts is a JSON array of objects with
-- campaign_id, generation, candidate_sha, fingerprint and optionally
-- base_sha, bundle, bundle_digest, evidence_location, log_tail, diff
-- (base64) and candidate_ref. Returns one
-- row per item: 'recorded' with its attempt number (also when that very
-- record committed before: a retried batch), or 'stale' (the lease was lost
-- or had expired: stand down for that one). Bad input fails the whole call
-- (LG007), and a repeated failed approach too (LG006), as with record_attempt.
CREATE OR REPLACE FUNCTION ledger_api.record_attempts(p_attempts jsonb)
    RETURNS TABLE (campaign_id bigint, generation bigint, status text, attempt_no integer)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_ids bigint[];
    v_done bigint[];
BEGIN
    IF p_attempts IS NULL OR jsonb_typeof(p_attempts) <> 'array'
       OR jsonb_array_length(p_attempts) NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'record_attempts takes a JSON array of 1 to 1000 attempts' USING ERRCODE = 'LG007';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_attempts) AS i(fingerprint text)
                WHERE NOT ledger.is_fingerprint(coalesce(i.fingerprint, ''))) THEN
        RAISE EXCEPTION 'an attempt needs a fingerprint (8-200 characters of [A-Za-z0-9:_.-])'
            USING ERRCODE = 'LG007';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_attempts)
                             AS i(campaign_id bigint, generation bigint, candidate_sha text, base_sha text)
                WHERE NOT ledger.is_commit_sha(coalesce(i.candidate_sha, '')) OR NOT ledger.is_commit_sha(i.base_sha)
                   OR i.campaign_id IS NULL OR i.generation IS NULL) THEN
        RAISE EXCEPTION 'each attempt needs campaign_id, generation and hexadecimal commit ids'
            USING ERRCODE = 'LG007';
    END IF;
    IF (SELECT count(DISTINCT i.campaign_id) <> count(*)
          FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint)) THEN
        RAISE EXCEPTION 'a batch names each campaign once' USING ERRCODE = 'LG007';
    END IF;
    -- Lock the batch's campaigns, in id order as every writer of several
    -- campaigns does; then, on a fresh snapshot, take the live leases.
    PERFORM 1 FROM ledger.campaign c
      JOIN jsonb_to_recordset(p_attempts) AS i(campaign_id bigint) ON i.campaign_id = c.id
     ORDER BY c.id FOR NO KEY UPDATE OF c;
    SELECT coalesce(array_agg(c.id), '{}') INTO v_ids
      FROM ledger.campaign c
      JOIN jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, generation bigint)
        ON i.campaign_id = c.id AND i.generation = c.generation
     WHERE c.state = 'leased' AND c.lease_expires_at > v_now;
    -- Items whose identical record committed before (a retried batch).
    SELECT coalesce(array_agg(a.campaign_id), '{}') INTO v_done
      FROM jsonb_to_recordset(p_attempts)
           AS i(campaign_id bigint, generation bigint, candidate_sha text, fingerprint text)
      JOIN ledger.attempt a ON a.campaign_id = i.campaign_id AND a.generation = i.generation
     WHERE a.outcome = 'attempted' AND a.candidate_sha = i.candidate_sha
       AND a.fingerprint = i.fingerprint;
    IF EXISTS (SELECT 1 FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, fingerprint text)
                 JOIN ledger.attempt a ON a.campaign_id = i.campaign_id AND a.fingerprint = i.fingerprint
                WHERE i.campaign_id = ANY (v_ids) AND (a.outcome = 'failed' OR a.verdict = 'rejected')) THEN
        RAISE EXCEPTION 'the next attempt must differ: an approach in this batch already failed on its campaign'
            USING ERRCODE = 'LG006';
    END IF;
    UPDATE ledger.attempt a
       SET outcome = 'attempted', ended_at = v_now, fingerprint = i.fingerprint,
           base_sha = i.base_sha, candidate_sha = i.candidate_sha, bundle = i.bundle,
           bundle_digest = i.bundle_digest, log_tail = i.log_tail,
           diff = decode(i.diff, 'base64'), candidate_ref = i.candidate_ref
      FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, generation bigint, candidate_sha text,
               fingerprint text, base_sha text, bundle jsonb, bundle_digest text, log_tail text,
               diff text, candidate_ref text)
     WHERE i.campaign_id = ANY (v_ids) AND a.campaign_id = i.campaign_id AND a.generation = i.generation;
    -- One UPDATE for the batch: the journal trigger reads each event's
    -- details and lease holder from that campaign's own rows.
    PERFORM ledger.begin_batch_transition('record_attempt', 'worker', NULL);
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
           CASE WHEN i.campaign_id = ANY (v_ids || v_done) THEN 'recorded' ELSE 'stale' END,
           CASE WHEN i.campaign_id = ANY (v_ids || v_done) THEN a.attempt_no END
      FROM jsonb_to_recordset(p_attempts) AS i(campaign_id bigint, generation bigint)
      LEFT JOIN ledger.attempt a ON a.campaign_id = i.campaign_id AND a.generation = i.generation
     ORDER BY i.campaign_id;
END
$$;

-- The attempt failed (or was drained): leased -> ready, maybe -> exhausted.
-- A drained attempt (the worker was shutting down) does not use up the
-- budget. Retrying the identical ending (same reason, same drained) after it
-- committed returns the state it left; anything else needs the live lease.
CREATE OR REPLACE FUNCTION ledger_api.fail_attempt(
        p_campaign_id bigint, p_generation bigint, p_reason text,
        p_fingerprint text DEFAULT NULL, p_retry_after_s double precision DEFAULT NULL,
        p_drained boolean DEFAULT false)
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign := ledger.lease_row(p_campaign_id, p_generation);
    v_a ledger.attempt;
    v_count integer;
    v_next timestamptz;
    v_attempt_no integer;
BEGIN
    IF p_reason IS NULL OR p_reason = '' THEN
        RAISE EXCEPTION 'a failed attempt needs a reason' USING ERRCODE = 'LG007';
    END IF;
    IF p_drained IS NULL THEN
        RAISE EXCEPTION 'drained must be true or false' USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('retry_after_s', p_retry_after_s, 0, 604800, true);
    SELECT * INTO v_a FROM ledger.attempt a
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
    IF v_a.outcome = (CASE WHEN p_drained THEN 'drained' ELSE 'failed' END)
       AND v_a.failure_reason = left(p_reason, 4000) THEN
        -- this very ending, retried: it is in
        RETURN coalesce(ledger.ended_as(p_campaign_id, p_generation,
                                        CASE WHEN p_drained THEN 'release' ELSE 'fail_attempt' END),
                        'ready');
    END IF;
    PERFORM ledger.check_live(v_c, p_generation);
    v_count := v_c.attempt_count + CASE WHEN p_drained THEN 0 ELSE 1 END;
    v_next := CASE WHEN p_drained THEN v_now
                   ELSE v_now + coalesce(make_interval(secs => p_retry_after_s),
                                         ledger.backoff(v_c.class, v_count)) END;
    UPDATE ledger.attempt a
       SET outcome = CASE WHEN p_drained THEN 'drained' ELSE 'failed' END,
           ended_at = v_now, failure_reason = left(p_reason, 4000), fingerprint = p_fingerprint
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation
    RETURNING a.attempt_no INTO v_attempt_no;
    -- A drained attempt is no failure of its own: the release transition,
    -- which charges nothing.
    PERFORM ledger.begin_transition(CASE WHEN p_drained THEN 'release' ELSE 'fail_attempt' END,
                'worker', v_c.lease_owner,
                jsonb_build_object('attempt_no', v_attempt_no, 'reason', left(p_reason, 4000),
                                   'drained', p_drained, 'next_attempt_at', v_next,
                                   'fingerprint', p_fingerprint));
    UPDATE ledger.campaign c
       SET state = 'ready', lease_owner = NULL, leased_at = NULL, lease_expires_at = NULL,
           attempt_count = v_count, next_attempt_at = v_next,
           last_failure_reason = left(p_reason, 4000)
     WHERE c.id = p_campaign_id;
    PERFORM ledger.end_transition();
    IF ledger.exhaust_if_spent(p_campaign_id) THEN
        RETURN 'exhausted';
    END IF;
    RETURN 'ready';
END
$$;

-- A fault that is not the attempt's own stopped it -- a remote that cannot
-- be reached, a candidate that could not be published, a configuration
-- error, Ledger's own crash: leased -> ready (the release transition),
-- charging nothing: no attempt used up, no approach refused, never
-- exhausted. The campaign says why it waits (waiting_on = 'system_fault')
-- and is retried after a pause that grows with the faults in a row (2 s,
-- doubling, at most 5 minutes; p_retry_after_s overrides it). Fenced like
-- every ending; an identical retry returns the first result.
CREATE OR REPLACE FUNCTION ledger_api.release_attempt(
        p_campaign_id bigint, p_generation bigint, p_reason text,
        p_retry_after_s double precision DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign := ledger.lease_row(p_campaign_id, p_generation);
    v_a ledger.attempt;
    v_next timestamptz;
    v_attempt_no integer;
BEGIN
    IF p_reason IS NULL OR length(p_reason) NOT BETWEEN 1 AND 4000 THEN
        RAISE EXCEPTION 'a released attempt needs a reason (1 to 4000 characters)' USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_range('retry_after_s', p_retry_after_s, 0, 86400, true);
    SELECT * INTO v_a FROM ledger.attempt a
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
    IF v_a.outcome = 'released' AND v_a.failure_reason = p_reason THEN
        RETURN 'ready';  -- this very release, retried: it is in
    END IF;
    PERFORM ledger.check_live(v_c, p_generation);
    v_next := v_now + make_interval(secs => coalesce(p_retry_after_s,
                                                     least(300, 2 * power(2, least(v_c.fault_count, 20)))));
    UPDATE ledger.attempt a
       SET outcome = 'released', ended_at = v_now, failure_reason = p_reason
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation
    RETURNING a.attempt_no INTO v_attempt_no;
    PERFORM ledger.begin_transition('release', 'worker', v_c.lease_owner,
                jsonb_build_object('attempt_no', v_attempt_no, 'reason', p_reason,
                                   'system_fault', true, 'next_attempt_at', v_next));
    UPDATE ledger.campaign c
       SET state = 'ready', lease_owner = NULL, leased_at = NULL, lease_expires_at = NULL,
           next_attempt_at = v_next, fault_count = c.fault_count + 1,
           waiting_on = 'system_fault', waiting_reason = p_reason,
           waiting_since = coalesce(c.waiting_since, v_now)
     WHERE c.id = p_campaign_id;
    PERFORM ledger.end_transition();
    RETURN 'ready';
END
$$;

-- The worker's look at its campaign's target (the class's sensor run once,
-- in a cell): before it starts an agent on a campaign opened a while ago
-- (p_moment 'before_start'), or before it charges an attempt that succeeded
-- but changed nothing ('changed_nothing'). The observation is recorded, saying
-- who re-observed, for which generation and when (details.reobserved). A
-- green one dismisses the campaign -- the observation its reason, nothing
-- charged -- and ends the attempt as released; a red one or an error changes
-- nothing (the attempt goes on and counts as before) and is journaled as
-- observation.reobserved. Fenced by generation and liveness; the same
-- re-observation retried returns its first result (its key: campaign,
-- generation, moment), a different one is refused (LG010).
CREATE OR REPLACE FUNCTION ledger_api.reobserve(
        p_campaign_id bigint, p_generation bigint, p_sensor text, p_status text,
        p_started_at timestamptz, p_finished_at timestamptz DEFAULT NULL,
        p_details jsonb DEFAULT '{}', p_moment text DEFAULT 'before_start')
    RETURNS TABLE (observation_id bigint, effect text, reason text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign;
    v_obs ledger.observation;
    v_key text;
    v_reason text;
    v_attempt_no integer;
BEGIN
    IF p_campaign_id IS NULL OR p_generation IS NULL THEN
        PERFORM ledger.check_lease_args(p_campaign_id, p_generation);  -- raises, saying what is missing
    END IF;
    IF p_status IS NULL OR p_status NOT IN ('green', 'red', 'error') THEN
        RAISE EXCEPTION 'observation status must be green, red or error, not %', coalesce(p_status, 'null')
            USING ERRCODE = 'LG007';
    END IF;
    IF p_moment IS NULL OR p_moment NOT IN ('before_start', 'changed_nothing') THEN
        RAISE EXCEPTION 'a re-observation is made before_start or changed_nothing, not %',
            coalesce(p_moment, 'null') USING ERRCODE = 'LG007';
    END IF;
    PERFORM ledger.check_length('sensor', p_sensor, 1, 200);
    IF p_started_at IS NULL OR p_started_at > v_now OR p_started_at < '2000-01-01 00:00:00+00' THEN
        RAISE EXCEPTION 'observation start % must be given, not in the future and not before 2000',
            p_started_at USING ERRCODE = 'LG007';
    END IF;
    -- The objective's lock before the campaign's row, in record_observation's
    -- order (the key of a campaign never changes).
    PERFORM ledger.lock_objective((SELECT c.objective_key FROM ledger.campaign c WHERE c.id = p_campaign_id));
    v_c := ledger.lease_row(p_campaign_id, p_generation);
    v_key := format('reobserve:%s:%s:%s', p_campaign_id, p_generation, p_moment);
    SELECT * INTO v_obs FROM ledger.observation o WHERE o.idempotency_key = v_key;
    IF FOUND THEN
        IF v_obs.request_digest IS DISTINCT FROM p_status THEN
            RAISE EXCEPTION 'campaign % generation % was re-observed % already (%), not %',
                p_campaign_id, p_generation, p_moment, v_obs.request_digest, p_status
                USING ERRCODE = 'LG010';
        END IF;
        RETURN QUERY SELECT v_obs.id, v_obs.effect, v_obs.reason;  -- this very one, retried
        RETURN;
    END IF;
    PERFORM ledger.check_live(v_c, p_generation);
    SELECT a.attempt_no INTO v_attempt_no FROM ledger.attempt a
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
    IF p_status = 'error' THEN
        v_reason := ledger.error_reason(p_details);
    END IF;
    INSERT INTO ledger.observation AS o
           (sensor, target, objective_key, class, status, started_at, finished_at, tick, details,
            campaign_id, effect, idempotency_key, request_digest, recorded_at, reason)
    VALUES (p_sensor, v_c.target, v_c.objective_key, v_c.class, p_status, p_started_at,
            coalesce(p_finished_at, v_now), NULL,
            coalesce(p_details, '{}') || jsonb_build_object('reobserved', jsonb_build_object(
                'by', v_c.lease_owner, 'campaign_id', p_campaign_id, 'generation', p_generation,
                'attempt_no', v_attempt_no, 'moment', p_moment)),
            -- an error links to no campaign (record_observation's rule)
            CASE WHEN p_status <> 'error' THEN p_campaign_id END,
            CASE WHEN p_status = 'green' THEN 'dismissed' ELSE 'recorded' END,
            v_key, p_status, v_now, v_reason)
    RETURNING * INTO v_obs;
    IF p_status = 'green' THEN
        v_reason := format('dismissed: the target was re-observed green (observation %s of sensor %s) %s; '
                           'nothing charged', v_obs.id, p_sensor,
                           CASE p_moment WHEN 'before_start' THEN 'before the agent started'
                                         ELSE 'after an attempt that changed nothing' END);
        UPDATE ledger.observation o SET reason = v_reason WHERE o.id = v_obs.id;
        UPDATE ledger.attempt a
           SET outcome = 'released', ended_at = v_now, failure_reason = v_reason
         WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
        PERFORM ledger.begin_transition('dismiss', 'worker', v_c.lease_owner,
                    jsonb_build_object('observation_id', v_obs.id, 'status', p_status,
                                       'started_at', p_started_at, 'counted', jsonb_build_array(v_obs.id),
                                       'attempt_no', v_attempt_no, 'reobserved', p_moment,
                                       'reason', v_reason));
        UPDATE ledger.campaign c
           SET state = 'dismissed', lease_owner = NULL, leased_at = NULL, lease_expires_at = NULL
         WHERE c.id = p_campaign_id;
        PERFORM ledger.end_transition();
    ELSE
        PERFORM ledger.append_event(p_campaign_id, 'observation.reobserved', v_c.lease_owner,
                    jsonb_build_object('observation_id', v_obs.id, 'status', p_status,
                                       'moment', p_moment, 'attempt_no', v_attempt_no)
                    || CASE WHEN v_reason IS NOT NULL THEN jsonb_build_object('reason', v_reason)
                            ELSE '{}'::jsonb END);
    END IF;
    RETURN QUERY SELECT v_obs.id, v_obs.effect, v_reason;
END
$$;

-- What the worker saw its attempt try outside its cell (a process left
-- running, the cell's monitor killed, a secret of Ledger's in its output, the
-- user's repository or Ledger's configuration changed meanwhile): kept in
-- security_event and journaled as security.detected. Fenced by generation
-- and liveness like every write of the lease holder; the same action with
-- the same reason reported again for the same generation (a lost reply)
-- returns the first record, while another reason is an event of its own
-- (one per destination the egress proxy refused). The worker then refuses
-- the candidate (fail_attempt).
CREATE OR REPLACE FUNCTION ledger_api.report_security_event(
        p_campaign_id bigint, p_generation bigint, p_action text, p_reason text,
        p_details jsonb DEFAULT '{}')
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_c ledger.campaign := ledger.lease_row(p_campaign_id, p_generation);
    v_id bigint;
    v_attempt_no integer;
BEGIN
    IF p_action IS NULL OR p_action !~ '^[a-z][a-z0-9_.]{0,63}$' THEN
        RAISE EXCEPTION 'a security event needs an action (lowercase, dotted, 1 to 64 characters)'
            USING ERRCODE = 'LG007';
    END IF;
    IF p_reason IS NULL OR length(p_reason) NOT BETWEEN 1 AND 4000 THEN
        RAISE EXCEPTION 'a security event needs a reason (1 to 4000 characters)' USING ERRCODE = 'LG007';
    END IF;
    IF p_details IS NOT NULL AND jsonb_typeof(p_details) <> 'object' THEN
        RAISE EXCEPTION 'security event details must be a JSON object' USING ERRCODE = 'LG007';
    END IF;
    SELECT e.id INTO v_id FROM ledger.security_event e
     WHERE e.campaign_id = p_campaign_id AND e.action = p_action AND e.reason = p_reason
       AND (e.details ->> 'generation')::bigint = p_generation;
    IF FOUND THEN
        RETURN v_id;  -- this very report, retried
    END IF;
    PERFORM ledger.check_live(v_c, p_generation);
    SELECT a.attempt_no INTO v_attempt_no FROM ledger.attempt a
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
    INSERT INTO ledger.security_event (at, actor_role, actor, campaign_id, action, target, reason, details)
    VALUES (ledger.now(), 'worker', v_c.lease_owner, p_campaign_id, p_action,
            format('campaign %s attempt %s', p_campaign_id, v_attempt_no), p_reason,
            coalesce(p_details, '{}') || jsonb_build_object('generation', p_generation,
                                                            'attempt_no', v_attempt_no))
    RETURNING id INTO v_id;
    PERFORM ledger.append_event(p_campaign_id, 'security.detected', v_c.lease_owner,
                jsonb_build_object('kind', p_action, 'attempt_no', v_attempt_no, 'reason', p_reason,
                                   'security_event_id', v_id));
    RETURN v_id;
END
$$;

-- A candidate refused for changing protected paths (tests, their
-- configuration, CI files): leased -> ready (maybe -> exhausted) exactly as
-- fail_attempt, whose fence it
-- uses; then the refusal is kept in security_event and journaled. A stale
-- caller raises LG001 from fail_attempt and nothing at all is written; an
-- identical retry returns the first result and writes nothing again.
CREATE OR REPLACE FUNCTION ledger_api.refuse_candidate(
        p_campaign_id bigint, p_generation bigint, p_reason text, p_fingerprint text,
        p_paths text[])
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_state text;
    v_worker text;
    v_attempt_no integer;
BEGIN
    IF p_campaign_id IS NULL OR p_generation IS NULL OR p_generation < 0 THEN
        RAISE EXCEPTION 'a campaign id and a generation (0 or more) are needed' USING ERRCODE = 'LG007';
    END IF;
    IF p_fingerprint IS NULL OR NOT ledger.is_fingerprint(p_fingerprint) THEN
        RAISE EXCEPTION 'a refused candidate needs its fingerprint (8-200 characters of [A-Za-z0-9:_.-])'
            USING ERRCODE = 'LG007';
    END IF;
    IF p_paths IS NULL OR cardinality(p_paths) NOT BETWEEN 1 AND 10000
       OR array_position(p_paths, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'name the protected paths the candidate changed (1 to 10000)'
            USING ERRCODE = 'LG007';
    END IF;
    IF EXISTS (SELECT 1 FROM ledger.security_event e
                WHERE e.campaign_id = p_campaign_id AND e.action = 'candidate.protected_paths'
                  AND (e.details ->> 'generation')::bigint = p_generation) THEN
        -- this very refusal, retried (its reply was lost): fail_attempt
        -- returns the state it left, or refuses a different ending
        RETURN ledger_api.fail_attempt(p_campaign_id, p_generation, p_reason, p_fingerprint);
    END IF;
    v_state := ledger_api.fail_attempt(p_campaign_id, p_generation, p_reason, p_fingerprint);
    SELECT a.worker, a.attempt_no INTO v_worker, v_attempt_no
      FROM ledger.attempt a WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
    INSERT INTO ledger.security_event (at, actor_role, actor, campaign_id, action, target, reason, details)
    VALUES (ledger.now(), 'worker', v_worker, p_campaign_id, 'candidate.protected_paths',
            left(array_to_string(p_paths[1:20], ', '), 2000), left(p_reason, 4000),
            jsonb_build_object('generation', p_generation, 'attempt_no', v_attempt_no,
                               'fingerprint', p_fingerprint, 'paths', to_jsonb(p_paths[1:1000])));
    PERFORM ledger.append_event(p_campaign_id, 'security.refused', v_worker,
                jsonb_build_object('kind', 'candidate.protected_paths', 'attempt_no', v_attempt_no,
                                   'fingerprint', p_fingerprint, 'paths', to_jsonb(p_paths[1:100])));
    RETURN v_state;
END
$$;

-- Fenced journal append for the lease holder: generation, state and expiry
-- are tested in the same statement that takes the seqs, so a fenced-out
-- batch writes nothing (and, rolled back, wakes nobody). With p_key, a
-- batch whose reply was lost and is sent again returns the seq it got the
-- first time instead of being appended twice (the holder appends one batch
-- at a time, so the last key is all it takes).
-- p_events: [{"type": "output", "payload": {...}, "delta": true}, ...]
CREATE OR REPLACE FUNCTION ledger_api.append_events(p_campaign_id bigint, p_generation bigint, p_events jsonb,
                                         p_key text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_n integer;
    v_last bigint;
BEGIN
    PERFORM ledger.check_lease_args(p_campaign_id, p_generation);
    IF jsonb_typeof(p_events) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'events must be a JSON array' USING ERRCODE = 'LG007';
    END IF;
    IF p_key IS NOT NULL AND length(p_key) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'an append key is 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    v_n := jsonb_array_length(p_events);
    IF v_n = 0 OR v_n > 1000 THEN
        RAISE EXCEPTION 'append 1 to 1000 events at a time, not %', v_n USING ERRCODE = 'LG007';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_events) e
                WHERE jsonb_typeof(e) <> 'object'
                   OR NOT ledger.is_event_type(coalesce(e ->> 'type', ''))
                   OR e ->> 'type' = 'transition'
                   OR (e ? 'payload' AND jsonb_typeof(e -> 'payload') <> 'object')
                   OR (e ? 'delta' AND jsonb_typeof(e -> 'delta') <> 'boolean')) THEN
        RAISE EXCEPTION 'each event needs a type (lowercase, not "transition"), an object payload and a boolean delta'
            USING ERRCODE = 'LG007';
    END IF;
    WITH head AS (
        UPDATE ledger.campaign c
           SET event_seq = c.event_seq + v_n,
               last_append_key = p_key, last_append_seq = c.event_seq + v_n
         WHERE c.id = p_campaign_id AND c.generation = p_generation AND c.state = 'leased'
           AND c.lease_expires_at > ledger.now()
           -- a retry whose first try committed while this one waited for the
           -- row lock: the re-checked row carries its key, so nothing matches
           AND (p_key IS NULL OR c.last_append_key IS DISTINCT FROM p_key)
        RETURNING c.event_seq, c.generation, c.lease_owner
    ), written AS (
        INSERT INTO ledger.campaign_event (campaign_id, seq, type, actor, generation, delta, payload,
                                           created_at, actor_role)
        SELECT p_campaign_id, head.event_seq - v_n + e.ord, e.value ->> 'type', head.lease_owner,
               head.generation, coalesce((e.value ->> 'delta')::boolean, false),
               coalesce(e.value -> 'payload', '{}'), ledger.now(), 'worker'
          FROM head, jsonb_array_elements(p_events) WITH ORDINALITY AS e(value, ord)
        RETURNING seq
    )
    SELECT max(seq) INTO v_last FROM written;
    IF v_last IS NULL THEN
        IF p_key IS NOT NULL THEN
            SELECT c.last_append_seq INTO v_last FROM ledger.campaign c
             WHERE c.id = p_campaign_id AND c.generation = p_generation AND c.last_append_key = p_key;
            IF FOUND THEN
                RETURN v_last;  -- this very batch, retried: it is in
            END IF;
        END IF;
        IF ledger.restart_grace() THEN
            -- the server just came back and the lease has its length again: once more
            RETURN ledger_api.append_events(p_campaign_id, p_generation, p_events, p_key);
        END IF;
        PERFORM ledger.raise_stale(p_campaign_id, p_generation);
    END IF;
    RETURN v_last;
END
$$;

-- Ask for a side effect (the outbox, ledger.dispatcher): fenced by generation and liveness,
-- checked against the class's authority profile. A forbidden request is
-- recorded in security_event and answered with status 'forbidden' -- not
-- raised, so the record commits with the refusal. The idempotency key makes
-- a retry return the intent already requested ('existing').
CREATE OR REPLACE FUNCTION ledger_api.request_side_effect(
        p_campaign_id bigint, p_generation bigint, p_kind text, p_target text,
        p_precondition jsonb, p_idempotency_key text, p_payload jsonb DEFAULT '{}')
    RETURNS TABLE (side_effect_id bigint, status text, state text)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign := ledger.lease_row(p_campaign_id, p_generation);
    v_authority jsonb;
    v_existing ledger.side_effect;
    v_id bigint;
BEGIN
    IF coalesce(p_idempotency_key, '') = '' OR coalesce(p_target, '') = '' THEN
        RAISE EXCEPTION 'a side effect needs a target and an idempotency key' USING ERRCODE = 'LG007';
    END IF;
    SELECT * INTO v_existing FROM ledger.side_effect s WHERE s.idempotency_key = p_idempotency_key;
    IF FOUND THEN
        IF v_existing.campaign_id <> p_campaign_id OR v_existing.generation <> p_generation
           OR v_existing.kind IS DISTINCT FROM p_kind OR v_existing.target <> p_target THEN
            RAISE EXCEPTION 'idempotency key % was used for a different side effect', p_idempotency_key
                USING ERRCODE = 'LG010';
        END IF;
        RETURN QUERY SELECT v_existing.id, 'existing'::text, v_existing.state;
        RETURN;
    END IF;
    PERFORM ledger.check_live(v_c, p_generation);
    IF p_kind IS NULL OR p_kind NOT IN ('git.update_ref', 'http.request') THEN
        RAISE EXCEPTION 'unknown side effect kind %', p_kind USING ERRCODE = 'LG007';
    END IF;
    SELECT cc.authority INTO v_authority FROM ledger.campaign_class cc WHERE cc.name = v_c.class;
    -- Every place the effect would touch must be inside the profile: the
    -- target, and for HTTP also each URL the payload names (the request and
    -- its read-back), or an allowed target could smuggle another host.
    IF NOT ledger.authorized(v_authority, 'worker', p_kind, p_target)
       OR (p_kind = 'http.request' AND EXISTS (
               SELECT 1 FROM unnest(ARRAY[p_payload ->> 'url', p_payload -> 'read_back' ->> 'url']) AS u(url)
                WHERE u.url IS NOT NULL
                  AND NOT ledger.authorized(v_authority, 'worker', p_kind, u.url))) THEN
        INSERT INTO ledger.security_event (at, actor_role, actor, campaign_id, action, target, reason, details)
        VALUES (v_now, 'worker', v_c.lease_owner, p_campaign_id, p_kind, p_target,
                format('outside the worker authority profile of class %s', v_c.class),
                jsonb_build_object('generation', p_generation, 'precondition', p_precondition,
                                   'payload', p_payload, 'idempotency_key', p_idempotency_key));
        PERFORM ledger.append_event(p_campaign_id, 'security.refused', v_c.lease_owner,
                    jsonb_build_object('kind', p_kind, 'target', p_target));
        RETURN QUERY SELECT NULL::bigint, 'forbidden'::text, NULL::text;
        RETURN;
    END IF;
    INSERT INTO ledger.side_effect (campaign_id, generation, kind, purpose, target, precondition,
                                    payload, idempotency_key, requested_by, requested_role,
                                    next_try_at, created_at, updated_at)
    VALUES (p_campaign_id, p_generation, p_kind, 'other', p_target, coalesce(p_precondition, '{}'),
            coalesce(p_payload, '{}'), p_idempotency_key, v_c.lease_owner, 'worker',
            v_now, v_now, v_now)
    RETURNING id INTO v_id;
    PERFORM ledger.append_event(p_campaign_id, 'side_effect.requested', v_c.lease_owner,
                jsonb_build_object('side_effect_id', v_id, 'kind', p_kind, 'target', p_target));
    PERFORM pg_notify('ledger_outbox', v_id::text);
    RETURN QUERY SELECT v_id, 'requested'::text, 'pending'::text;
END
$$;

-- What the attempt reported it used (the attempt protocol's usage lines):
-- tokens in and out, requests, cost in the agents' currency unit, as
-- increments. Fenced by generation and liveness like every write of the
-- lease holder; every figure range-checked (a negative, absurd or missing
-- one is refused with its name, LG007, and nothing of it is kept); at most
-- 10000 reports per attempt. Summed per attempt (attempt_usage), per
-- campaign (cost_spent) and per key per UTC day (limit_key.day_cost); the
-- tokens push the buckets of the resources the campaign uses. With p_key, a
-- report whose reply was lost and is sent again is counted once. Journaled
-- (usage.reported). Says what the campaign has spent against its budget.
CREATE OR REPLACE FUNCTION ledger_api.report_usage(
        p_campaign_id bigint, p_generation bigint, p_tokens_in bigint DEFAULT 0,
        p_tokens_out bigint DEFAULT 0, p_requests bigint DEFAULT 0, p_cost double precision DEFAULT 0,
        p_key text DEFAULT NULL)
    RETURNS TABLE (cost_spent numeric, max_cost numeric, over_budget boolean)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := ledger.now();
    v_c ledger.campaign := ledger.lease_row(p_campaign_id, p_generation);
    v_u ledger.attempt_usage;
    v_attempt_no integer;
    v_tokens bigint;
    v_spent numeric;
    v_day date := (v_now AT TIME ZONE 'UTC')::date;
    v_cost numeric;
BEGIN
    PERFORM ledger.check_range('tokens_in', p_tokens_in, 0, 1000000000);
    PERFORM ledger.check_range('tokens_out', p_tokens_out, 0, 1000000000);
    PERFORM ledger.check_range('requests', p_requests, 0, 1000000);
    PERFORM ledger.check_range('cost', p_cost, 0, 1000000);
    v_cost := round(p_cost::numeric, 9);
    IF p_key IS NOT NULL AND length(p_key) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'a usage report key is 1 to 200 characters' USING ERRCODE = 'LG007';
    END IF;
    SELECT * INTO v_u FROM ledger.attempt_usage u
     WHERE u.campaign_id = p_campaign_id AND u.generation = p_generation FOR UPDATE;
    IF FOUND AND p_key IS NOT NULL AND v_u.last_key = p_key THEN
        RETURN QUERY SELECT v_c.cost_spent, v_c.max_cost, coalesce(v_c.cost_spent >= v_c.max_cost, false);  -- retried
        RETURN;
    END IF;
    PERFORM ledger.check_live(v_c, p_generation);
    IF coalesce(v_u.reports, 0) >= 10000 THEN
        RAISE EXCEPTION 'attempt of campaign % reported usage 10000 times: no more are taken', p_campaign_id
            USING ERRCODE = 'LG007';
    END IF;
    SELECT a.attempt_no INTO v_attempt_no FROM ledger.attempt a
     WHERE a.campaign_id = p_campaign_id AND a.generation = p_generation;
    INSERT INTO ledger.attempt_usage AS u (campaign_id, generation, attempt_no, class, tokens_in, tokens_out,
                                           requests, cost, reports, last_key, first_at, last_at)
    VALUES (p_campaign_id, p_generation, v_attempt_no, v_c.class, p_tokens_in, p_tokens_out, p_requests,
            v_cost, 1, p_key, v_now, v_now)
    ON CONFLICT (campaign_id, generation) DO UPDATE
       SET tokens_in = u.tokens_in + excluded.tokens_in, tokens_out = u.tokens_out + excluded.tokens_out,
           requests = u.requests + excluded.requests, cost = u.cost + excluded.cost,
           reports = u.reports + 1, last_key = excluded.last_key, last_at = excluded.last_at;
    UPDATE ledger.campaign c SET cost_spent = c.cost_spent + v_cost
     WHERE c.id = p_campaign_id
    RETURNING c.cost_spent INTO v_spent;
    IF cardinality(v_c.limit_keys) > 0 THEN
        UPDATE ledger.limit_key k
           SET day_cost = CASE WHEN k.day = v_day THEN k.day_cost + v_cost ELSE v_cost END,
               day = v_day, cost_total = k.cost_total + v_cost
         WHERE k.key = ANY (v_c.limit_keys);
    END IF;
    v_tokens := p_tokens_in + p_tokens_out;
    IF v_tokens > 0 AND cardinality(v_c.resources) > 0 THEN
        UPDATE ledger.limit_bucket b
           SET token_tat = CASE WHEN b.tokens_per_minute IS NULL THEN b.token_tat
                                ELSE greatest(b.token_tat, v_now)
                                     + make_interval(secs => v_tokens * 60.0 / b.tokens_per_minute) END,
               tokens = b.tokens + v_tokens
         WHERE b.resource = ANY (v_c.resources);
    END IF;
    PERFORM ledger.append_event(p_campaign_id, 'usage.reported', v_c.lease_owner,
                jsonb_build_object('attempt_no', v_attempt_no, 'tokens_in', p_tokens_in,
                                   'tokens_out', p_tokens_out, 'requests', p_requests, 'cost', v_cost,
                                   'cost_spent', v_spent, 'max_cost', v_c.max_cost));
    RETURN QUERY SELECT v_spent, v_c.max_cost, coalesce(v_spent >= v_c.max_cost, false);
END
$$;
