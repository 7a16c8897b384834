-- Internal helpers the role APIs share
--
-- Schema ledger: not executable by runtime roles (grants.sql). Errors carry
-- Ledger's own SQLSTATEs (src/ledger/errors.py has the table):
--   LG001 stale lease     LG002 illegal transition   LG003 forbidden
--   LG004 not found       LG005 duplicate objective  LG006 repeated approach
--   LG007 invalid input   LG008 same identity        LG009 immutable record
--   LG010 idempotency key reused with another request
--   LG014 limit reached (a claim lost a key's last slot: limits.sql)

-- A numeric argument within [p_min, p_max]; NaN and the infinities are out
-- of every range (NaN compares greater than every number in PostgreSQL).
CREATE OR REPLACE FUNCTION ledger.check_range(p_name text, p_value double precision,
                                   p_min double precision, p_max double precision,
                                   p_nullable boolean DEFAULT false)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_value IS NULL THEN
        IF p_nullable THEN
            RETURN;
        END IF;
        RAISE EXCEPTION '% is required', p_name USING ERRCODE = 'LG007';
    END IF;
    IF NOT (p_value BETWEEN p_min AND p_max) THEN
        RAISE EXCEPTION '% must be a finite number from % to %, not %', p_name, p_min, p_max, p_value
            USING ERRCODE = 'LG007';
    END IF;
END
$$;

-- A text argument of p_min to p_max characters, refused in words: the
-- table's CHECK says the same, but names only its constraint.
CREATE OR REPLACE FUNCTION ledger.check_length(p_name text, p_value text,
                                    p_min integer, p_max integer)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF coalesce(length(p_value), 0) NOT BETWEEN p_min AND p_max THEN
        RAISE EXCEPTION '% must be % to % characters long, not %', p_name, p_min, p_max,
            coalesce(length(p_value), 0) USING ERRCODE = 'LG007';
    END IF;
END
$$;

-- A W3C trace context as a campaign keeps it (campaign.trace_context): an
-- object of a version-00 traceparent (lower-case hex, ids not all zero) and
-- an optional tracestate of at most 512 characters, nothing else.
CREATE OR REPLACE FUNCTION ledger.is_trace_context(p_value jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE
AS $$
    -- coalesce: a missing part is false, not NULL (which an IF NOT would let by)
    SELECT coalesce(pg_catalog.jsonb_typeof(p_value) = 'object'
       AND (p_value OPERATOR(pg_catalog.-) 'traceparent' OPERATOR(pg_catalog.-) 'tracestate')
           OPERATOR(pg_catalog.=) '{}'::jsonb
       AND pg_catalog.jsonb_typeof(p_value OPERATOR(pg_catalog.->) 'traceparent') = 'string'
       AND (p_value OPERATOR(pg_catalog.->>) 'traceparent')
           OPERATOR(pg_catalog.~) '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       AND pg_catalog.substr(p_value OPERATOR(pg_catalog.->>) 'traceparent', 4, 32)
           OPERATOR(pg_catalog.<>) '00000000000000000000000000000000'
       AND pg_catalog.substr(p_value OPERATOR(pg_catalog.->>) 'traceparent', 37, 16)
           OPERATOR(pg_catalog.<>) '0000000000000000'
       AND coalesce(pg_catalog.jsonb_typeof(p_value OPERATOR(pg_catalog.->) 'tracestate'), 'string') = 'string'
       AND coalesce(pg_catalog.length(p_value OPERATOR(pg_catalog.->>) 'tracestate'), 0) <= 512, false)
$$;

-- The syntax of an approach's fingerprint and of a commit id, written once.
-- A length test and an unbounded class accept exactly what the counted
-- forms ('^[A-Za-z0-9:_.-]{8,200}$', '^[0-9a-f]{7,64}$') accept; PostgreSQL's
-- regex engine expands a counted repetition into one state per count, and
-- matching those cost 9-49 us each against 1.4-2.9 us for these (bench cost,
-- /work/shared/PERF.md). SQL expressions without SET or STRICT: the planner
-- inlines them into the caller's cached plan.
CREATE OR REPLACE FUNCTION ledger.is_fingerprint(p_value text) RETURNS boolean
    LANGUAGE sql IMMUTABLE
AS $$
    SELECT pg_catalog.length(p_value) BETWEEN 8 AND 200 AND p_value OPERATOR(pg_catalog.~) '^[A-Za-z0-9:_.-]+$'
$$;

CREATE OR REPLACE FUNCTION ledger.is_commit_sha(p_value text) RETURNS boolean
    LANGUAGE sql IMMUTABLE
AS $$
    SELECT pg_catalog.length(p_value) BETWEEN 7 AND 64 AND p_value OPERATOR(pg_catalog.~) '^[0-9a-f]+$'
$$;

-- A journal event's type, as campaign_event's CHECK states it (journal.sql;
-- a CHECK writes the expression out: it is re-read at every INSERT, and an
-- SQL function there would be parsed again each time).
CREATE OR REPLACE FUNCTION ledger.is_event_type(p_value text) RETURNS boolean
    LANGUAGE sql IMMUTABLE
AS $$
    SELECT pg_catalog.length(p_value) <= 64 AND p_value OPERATOR(pg_catalog.~) '^[a-z][a-z0-9_.]*$'
$$;

-- The identity of a lease: both parts given.
CREATE OR REPLACE FUNCTION ledger.check_lease_args(p_campaign_id bigint, p_generation bigint)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF p_campaign_id IS NULL OR p_generation IS NULL THEN
        RAISE EXCEPTION 'a lease holder''s write needs its campaign id and generation (got %, %)',
            coalesce(p_campaign_id::text, 'null'), coalesce(p_generation::text, 'null')
            USING ERRCODE = 'LG007';
    END IF;
END
$$;

-- The campaign a lease names, locked. Callers with an idempotent ending look
-- at what the lease already wrote (after the lock, so a first try that
-- committed meanwhile is seen) before they test it with ledger.check_live.
CREATE OR REPLACE FUNCTION ledger.lease_row(p_campaign_id bigint, p_generation bigint)
    RETURNS ledger.campaign
    LANGUAGE plpgsql
AS $$
DECLARE
    v_c ledger.campaign;
BEGIN
    IF p_campaign_id IS NULL OR p_generation IS NULL THEN
        PERFORM ledger.check_lease_args(p_campaign_id, p_generation);  -- raises, saying what is missing
    END IF;
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign % does not exist', p_campaign_id USING ERRCODE = 'LG004';
    END IF;
    RETURN v_c;
END
$$;

-- The server this database runs on, as it is now: when its postmaster
-- started and its WAL timeline (a restart changes the first, a failover the
-- second). Cheap: two built-ins, no I/O.
CREATE OR REPLACE FUNCTION ledger.server_incarnation() RETURNS text
    LANGUAGE sql
    STABLE
AS $$
    SELECT pg_catalog.pg_postmaster_start_time()::text || ' timeline '
           || pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8)
$$;

-- A database restart or failover costs no lease (docs/running/faults.md): a
-- holder whose heartbeats failed while the server was down is no lost worker.
-- The first caller to meet a new incarnation of the server (ledger.meta
-- server_incarnation) gives every lease in flight -- each campaign's, and each
-- verification's -- its whole length again, counted from now, the moment the
-- server is back as far as Ledger can tell, and journals it; once per
-- incarnation, under the meta row's lock. Called on the slow paths only:
-- before the reaper reaps, before a verifier's claim marks lapsed
-- verifications lost, and where a holder's write finds its lease expired.
-- Returns whether this call (or one it waited for) renewed them. A holder
-- that never comes back (killed) is reaped one lease later, charged as
-- before.
CREATE OR REPLACE FUNCTION ledger.restart_grace() RETURNS boolean
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := ledger.now();
    v_key text := ledger.server_incarnation();
    v_seen text;
BEGIN
    SELECT m.value INTO v_seen FROM ledger.meta m WHERE m.key = 'server_incarnation';
    IF v_seen = v_key THEN
        RETURN false;
    ELSIF v_seen IS NULL THEN
        -- the first look at this server (a new database): nothing to forgive yet
        INSERT INTO ledger.meta (key, value) VALUES ('server_incarnation', v_key) ON CONFLICT (key) DO NOTHING;
        RETURN false;
    END IF;
    SELECT m.value INTO v_seen FROM ledger.meta m WHERE m.key = 'server_incarnation' FOR UPDATE;
    IF v_seen = v_key THEN
        RETURN true;  -- another caller renewed them while this one waited for the lock
    END IF;
    UPDATE ledger.meta SET value = v_key WHERE key = 'server_incarnation';
    WITH renewed AS (
        UPDATE ledger.campaign c
           SET lease_expires_at = v_now + make_interval(secs => cc.lease_seconds),
               event_seq = c.event_seq + 1
          FROM ledger.campaign_class cc
         WHERE c.state = 'leased' AND cc.name = c.class
           AND c.lease_expires_at < v_now + make_interval(secs => cc.lease_seconds)
        RETURNING c.id, c.generation, c.event_seq, c.lease_expires_at
    ), mirrored AS (
        UPDATE ledger.attempt a SET lease_expires_at = r.lease_expires_at
          FROM renewed r
         WHERE a.campaign_id = r.id AND a.generation = r.generation AND a.outcome = 'running'
    )
    INSERT INTO ledger.campaign_event (campaign_id, seq, type, actor, generation, payload, created_at,
                                       actor_role)
    SELECT r.id, r.event_seq, 'lease.renewed', 'system', r.generation,
           jsonb_build_object('reason', 'the database restarted or failed over during the lease: '
                                        || 'its whole length again, from when it was back',
                              'lease_expires_at', r.lease_expires_at, 'server', v_key),
           v_now, 'system'
      FROM renewed r;
    UPDATE ledger.verification v
       SET lease_expires_at = v_now + make_interval(secs => coalesce(v.lease_s, 120))
     WHERE v.status = 'running'
       AND v.lease_expires_at < v_now + make_interval(secs => coalesce(v.lease_s, 120));
    RETURN true;
END
$$;

-- Refuse unless generation p_generation holds the live lease of campaign
-- p_c now: the right generation, leased, and not expired by the database's
-- clock -- whether or not a reaper has run. An expired one is first given
-- its restart grace (ledger.restart_grace): live again if the server came
-- back since.
CREATE OR REPLACE FUNCTION ledger.check_live(p_c ledger.campaign, p_generation bigint)
    RETURNS void
    LANGUAGE plpgsql
AS $$
DECLARE
    v_expires timestamptz;
BEGIN
    IF p_c.generation <> p_generation OR p_c.state <> 'leased' THEN
        RAISE EXCEPTION 'stale lease on campaign %: generation % is not current (generation %, state %)',
            p_c.id, p_generation, p_c.generation, p_c.state
            USING ERRCODE = 'LG001',
                  DETAIL = json_build_object('generation', p_c.generation, 'state', p_c.state)::text;
    END IF;
    IF p_c.lease_expires_at <= ledger.now() THEN
        -- (looked for only when the lease has lapsed; read back by a statement
        -- of its own, which sees what the grace just wrote)
        IF ledger.restart_grace() THEN
            SELECT c.lease_expires_at INTO v_expires FROM ledger.campaign c WHERE c.id = p_c.id;
            IF v_expires > ledger.now() THEN
                RETURN;
            END IF;
        END IF;
        RAISE EXCEPTION 'stale lease on campaign %: generation % expired at % (not yet reaped)',
            p_c.id, p_generation, p_c.lease_expires_at
            USING ERRCODE = 'LG001',
                  DETAIL = json_build_object('generation', p_c.generation, 'state', p_c.state,
                                             'expired', true)::text;
    END IF;
END
$$;

-- Both of the above: the campaign, locked, if p_generation's lease is live.
CREATE OR REPLACE FUNCTION ledger.fence(p_campaign_id bigint, p_generation bigint)
    RETURNS ledger.campaign
    LANGUAGE plpgsql
AS $$
DECLARE
    v_c ledger.campaign := ledger.lease_row(p_campaign_id, p_generation);
BEGIN
    PERFORM ledger.check_live(v_c, p_generation);
    RETURN v_c;
END
$$;

-- For the one-statement writers (heartbeat, append_events) whose UPDATE
-- matched nothing: say why.
CREATE OR REPLACE FUNCTION ledger.raise_stale(p_campaign_id bigint, p_generation bigint) RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_c ledger.campaign;
BEGIN
    SELECT * INTO v_c FROM ledger.campaign c WHERE c.id = p_campaign_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'campaign % does not exist', p_campaign_id USING ERRCODE = 'LG004';
    END IF;
    PERFORM ledger.check_live(v_c, p_generation);
    -- live again by now (cannot happen: a lease is only renewed by its holder)
    RAISE EXCEPTION 'stale lease on campaign %: generation % was not live at the write',
        p_campaign_id, p_generation USING ERRCODE = 'LG001';
END
$$;

-- Delay before the next attempt after n failures: base * factor^(n-1), capped,
-- with +/- jitter so a fleet does not retry in lockstep.
CREATE OR REPLACE FUNCTION ledger.backoff(p_class text, p_failures integer) RETURNS interval
    LANGUAGE sql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT make_interval(secs => greatest(0,
               least(cc.backoff_cap_s,
                     cc.backoff_base_s * power(cc.backoff_factor, greatest(p_failures - 1, 0)))
               * (1 + cc.backoff_jitter * (2 * random() - 1))))
      FROM ledger.campaign_class cc WHERE cc.name = p_class
$$;

-- A campaign back in ready with its attempts used up goes to exhausted.
CREATE OR REPLACE FUNCTION ledger.exhaust_if_spent(p_campaign_id bigint) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_rows integer;
BEGIN
    PERFORM ledger.begin_transition('exhaust', 'system', 'system',
                                    jsonb_build_object('reason', 'attempts used up'));
    UPDATE ledger.campaign c SET state = 'exhausted'
     WHERE c.id = p_campaign_id AND c.state = 'ready' AND c.attempt_count >= c.max_attempts;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    PERFORM ledger.end_transition();
    RETURN v_rows > 0;
END
$$;

-- Does a class's authority profile let `p_role` touch `p_target` with `p_kind`?
-- Profiles list glob patterns ('*' matches anything): refs for git, hosts for http.
CREATE OR REPLACE FUNCTION ledger.authorized(p_authority jsonb, p_role text, p_kind text, p_target text)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (
        SELECT 1
          FROM jsonb_array_elements_text(
                   coalesce(p_authority -> p_role -> CASE p_kind WHEN 'git.update_ref' THEN 'refs'
                                                                 WHEN 'http.request' THEN 'hosts' END,
                            '[]')) AS pattern
         WHERE CASE p_kind
                   WHEN 'git.update_ref' THEN p_target
                   ELSE substring(p_target FROM '^[a-z]+://([^/:?#]+)')
               END
               LIKE replace(replace(replace(replace(pattern, '\', '\\'), '%', '\%'), '_', '\_'),
                            '*', '%'))
$$;

-- Which intents of generation p_generation may still be carried out: those
-- whose attempt is still in play or succeeded (a candidate awaiting approval
-- is in play: its notice goes out; its promotion is only requested once it
-- is approved, approval.sql).
CREATE OR REPLACE FUNCTION ledger.generation_live(p_c ledger.campaign, p_generation bigint)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE
AS $$
    SELECT p_c.generation = p_generation
       AND p_c.state IN ('leased', 'attempted', 'verified', 'awaiting_approval', 'confirmed')
$$;

-- The state an ending of generation p_generation left its campaign in,
-- from the journal: the transition's `to`, or exhausted if the next event
-- exhausted it. (For an identical retry of that ending.)
CREATE OR REPLACE FUNCTION ledger.ended_as(p_campaign_id bigint, p_generation bigint, p_transition text)
    RETURNS text
    LANGUAGE sql STABLE
AS $$
    SELECT CASE WHEN n.payload ->> 'transition' = 'exhaust' THEN 'exhausted'
                ELSE e.payload ->> 'to' END
      FROM ledger.campaign_event e
      LEFT JOIN ledger.campaign_event n
             ON n.campaign_id = e.campaign_id AND n.seq = e.seq + 1 AND n.type = 'transition'
     WHERE e.campaign_id = p_campaign_id AND e.type = 'transition'
       AND e.generation = p_generation AND e.payload ->> 'transition' = p_transition
     ORDER BY e.seq DESC
     LIMIT 1
$$;
