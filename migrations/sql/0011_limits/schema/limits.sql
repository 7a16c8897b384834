-- Limits and budgets: caps per key, rate buckets per named resource, usage
-- reported per attempt, and spend bounded per campaign and per key per day
-- (docs/limits.md).
--
-- A campaign is counted under its limit keys (campaign.limit_keys, resolved
-- at the open from its class's templates and its labels: class:<name>,
-- repo:<name>, tenant:acme ...). Each key is a row of ledger.limit_key with
-- its caps, and its leases are counted in SHARDS rows of ledger.limit_shard,
-- the cap split among them: a claim takes a slot in a shard with room and
-- the lease remembers which (campaign.limit_shards), so that concurrent
-- claims and endings of one key rarely meet on a row (a single counter row
-- was locked by every claim and ending until its commit: the fleet went at
-- the pace of one WAL flush at a time; bench/limits.py). The counters are
-- kept by a trigger on every state change of a campaign into and out of
-- leased, so every ending -- a record, a failure, a release, the reaper, an
-- abandon -- gives its slot back in the transaction that ends the lease;
-- verifications are counted on limit_key itself (into and out of running).
-- The claim (api_worker.sql) skips a campaign one of whose keys is at its
-- cap; taking the slot, with `leased < its share` tested on the locked row,
-- is what makes that atomic across workers: two claimers racing for one
-- slot queue on its shard, and the second one's re-checked row is full
-- (LG014: that claim tries the next campaign). Nothing is charged to a
-- campaign that waits: it stays ready, its waiting_for says why.

-- One key: its caps (NULL: no cap), its weight among the keys of a class
-- (fair claims), its counters and today's spend.
CREATE TABLE IF NOT EXISTS ledger.limit_key (
    key              text PRIMARY KEY
                     CONSTRAINT limit_key_key_check CHECK (key ~ '^[a-z][a-z0-9_.-]{0,31}:[^[:space:]]{1,200}$'),
    max_leased       integer CONSTRAINT limit_key_max_leased_check CHECK (max_leased BETWEEN 0 AND 1000000),
    max_verifying    integer CONSTRAINT limit_key_max_verifying_check CHECK (max_verifying BETWEEN 0 AND 1000000),
    max_cost_per_day numeric CONSTRAINT limit_key_max_cost_per_day_check
                     CHECK (max_cost_per_day BETWEEN 0 AND 1000000000),
    weight           integer NOT NULL DEFAULT 1 CONSTRAINT limit_key_weight_check CHECK (weight BETWEEN 1 AND 1000),
    verifying        integer NOT NULL DEFAULT 0 CONSTRAINT limit_key_verifying_check CHECK (verifying >= 0),
    -- spend of the UTC day `day` (a report on a later day starts it again)
    day              date,
    day_cost         numeric NOT NULL DEFAULT 0 CONSTRAINT limit_key_day_cost_check CHECK (day_cost >= 0),
    cost_total       numeric NOT NULL DEFAULT 0 CONSTRAINT limit_key_cost_total_check CHECK (cost_total >= 0),
    updated_at       timestamptz NOT NULL,
    updated_by       text
);

-- A key's leases, in 8 shards: shard i holds at most its share of the cap
-- (max_leased / 8, the remainder to the first shards; NULL: no cap). A
-- shard's leases are the slots claims took (`taken`, on this row, locked by
-- the claim that takes one) less those endings gave back (limit_given, 8
-- lanes per shard by the ending's backend): an ending never waits for a
-- claim, and a claim reads the given-back slots without a lock -- a count
-- that is behind only ever counts a slot as still held.
CREATE TABLE IF NOT EXISTS ledger.limit_shard (
    key        text NOT NULL REFERENCES ledger.limit_key (key),
    shard      smallint NOT NULL CONSTRAINT limit_shard_shard_check CHECK (shard BETWEEN 0 AND 7),
    max_leased integer CONSTRAINT limit_shard_max_leased_check CHECK (max_leased >= 0),
    taken      bigint NOT NULL DEFAULT 0 CONSTRAINT limit_shard_taken_check CHECK (taken >= 0),
    PRIMARY KEY (key, shard)
);

CREATE TABLE IF NOT EXISTS ledger.limit_given (
    key   text NOT NULL,
    shard smallint NOT NULL,
    lane  smallint NOT NULL CONSTRAINT limit_given_lane_check CHECK (lane BETWEEN 0 AND 7),
    given bigint NOT NULL DEFAULT 0 CONSTRAINT limit_given_given_check CHECK (given >= 0),
    PRIMARY KEY (key, shard, lane),
    FOREIGN KEY (key, shard) REFERENCES ledger.limit_shard (key, shard)
);

-- A named resource (a model provider): requests and tokens per minute, as
-- GCRA: the theoretical arrival time of the next request (token) -- a claim
-- of a class that uses the resource waits until request_tat and token_tat
-- are both past, and pushes request_tat one emission interval (60 s / rpm)
-- further; reported tokens push token_tat (tokens x 60 s / tpm). The
-- requests are taken in `shards` rows of limit_bucket_shard, each at
-- rpm / shards, so that concurrent claims rarely wait on one another: one
-- shard below 600 requests a minute, at most 8 above. Over any window W at
-- most shards + rpm x W / 60 claims: with shards <= rpm / 600, the
-- overshoot over ten minutes stays below 1 in 6,000.
CREATE TABLE IF NOT EXISTS ledger.limit_bucket (
    resource            text PRIMARY KEY
                        CONSTRAINT limit_bucket_resource_check CHECK (resource ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    requests_per_minute double precision
                        CONSTRAINT limit_bucket_requests_per_minute_check
                        CHECK (requests_per_minute > 0 AND requests_per_minute <= 1000000),
    tokens_per_minute   double precision
                        CONSTRAINT limit_bucket_tokens_per_minute_check
                        CHECK (tokens_per_minute > 0 AND tokens_per_minute <= 10000000000),
    shards              smallint NOT NULL DEFAULT 1 CONSTRAINT limit_bucket_shards_check CHECK (shards BETWEEN 1 AND 8),
    token_tat           timestamptz NOT NULL DEFAULT '-infinity',
    tokens              bigint NOT NULL DEFAULT 0,  -- reported, in all
    updated_at          timestamptz NOT NULL,
    updated_by          text
);

CREATE TABLE IF NOT EXISTS ledger.limit_bucket_shard (
    resource    text NOT NULL REFERENCES ledger.limit_bucket (resource),
    shard       smallint NOT NULL CONSTRAINT limit_bucket_shard_shard_check CHECK (shard BETWEEN 0 AND 7),
    request_tat timestamptz NOT NULL DEFAULT '-infinity',
    requests    bigint NOT NULL DEFAULT 0,  -- taken, in all
    PRIMARY KEY (resource, shard)
);

-- What one attempt (a lease's generation) reported it used, summed.
CREATE TABLE IF NOT EXISTS ledger.attempt_usage (
    campaign_id bigint NOT NULL REFERENCES ledger.campaign (id),
    generation  bigint NOT NULL,
    attempt_no  integer NOT NULL,
    class       text NOT NULL,
    tokens_in   bigint NOT NULL DEFAULT 0 CONSTRAINT attempt_usage_tokens_in_check CHECK (tokens_in >= 0),
    tokens_out  bigint NOT NULL DEFAULT 0 CONSTRAINT attempt_usage_tokens_out_check CHECK (tokens_out >= 0),
    requests    bigint NOT NULL DEFAULT 0 CONSTRAINT attempt_usage_requests_check CHECK (requests >= 0),
    cost        numeric NOT NULL DEFAULT 0 CONSTRAINT attempt_usage_cost_check CHECK (cost >= 0),
    reports     integer NOT NULL DEFAULT 0 CONSTRAINT attempt_usage_reports_check CHECK (reports BETWEEN 0 AND 100000),
    last_key    text,
    first_at    timestamptz NOT NULL,
    last_at     timestamptz NOT NULL,
    PRIMARY KEY (campaign_id, generation)
);
CREATE INDEX IF NOT EXISTS attempt_usage_by_class ON ledger.attempt_usage (class, last_at);

-- The journal of the limits themselves: a key's caps or a bucket's rates
-- set (by whom), a campaign's budget raised, a bucket that made claims wait
-- refilled. Append-only.
CREATE TABLE IF NOT EXISTS ledger.limit_event (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at         timestamptz NOT NULL,
    type       text NOT NULL CONSTRAINT limit_event_type_check CHECK (type ~ '^[a-z][a-z0-9_.]{0,63}$'),
    subject    text NOT NULL,
    actor      text NOT NULL,
    actor_role text NOT NULL,
    detail     jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS limit_event_by_subject ON ledger.limit_event (subject, id);

CREATE OR REPLACE FUNCTION ledger.limit_event_append_only() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'limit events are append-only' USING ERRCODE = 'LG009';
END
$$;
CREATE OR REPLACE TRIGGER limit_event_append_only BEFORE UPDATE OR DELETE ON ledger.limit_event
    FOR EACH ROW EXECUTE FUNCTION ledger.limit_event_append_only();

CREATE OR REPLACE FUNCTION ledger.limit_journal(p_type text, p_subject text, p_actor text,
                                                p_role text, p_detail jsonb DEFAULT '{}')
    RETURNS bigint
    LANGUAGE sql
AS $$
    INSERT INTO ledger.limit_event (at, type, subject, actor, actor_role, detail)
    VALUES (ledger.now(), p_type, p_subject, coalesce(p_actor, p_role), p_role, coalesce(p_detail, '{}'))
    RETURNING id
$$;

-- The keys a campaign is counted under: each template of its class
-- resolved -- 'class' is class:<name>, 'repo' is repo:<the target's
-- repository name>, a word W is every label W:<value> of the campaign, and
-- a template with a colon is that very key -- distinct and sorted (the
-- counters' rows are locked in this order).
CREATE OR REPLACE FUNCTION ledger.resolve_limit_keys(p_templates text[], p_class text,
                                                     p_target text, p_labels text[])
    RETURNS text[]
    LANGUAGE sql IMMUTABLE
AS $$
    SELECT coalesce(array_agg(DISTINCT k ORDER BY k), '{}')
      FROM (SELECT CASE
                       WHEN t = 'class' THEN 'class:' || p_class
                       WHEN t = 'repo' THEN 'repo:' || regexp_replace(
                            regexp_replace(split_part(p_target, '#', 1), '^.*[/:]', ''), '\.git$', '')
                       WHEN position(':' IN t) > 0 THEN t
                   END AS k
              FROM unnest(p_templates) t
             UNION ALL
            SELECT l
              FROM unnest(p_templates) t, unnest(coalesce(p_labels, '{}')) l
             WHERE position(':' IN t) = 0 AND t NOT IN ('class', 'repo') AND l LIKE t || ':_%') x
     WHERE k IS NOT NULL AND k ~ '^[a-z][a-z0-9_.-]{0,31}:[^[:space:]]{1,200}$'
$$;

-- A campaign's key of its class's fair_key template (the first of its
-- resolved keys), or NULL for a class without one.
CREATE OR REPLACE FUNCTION ledger.resolve_fair_key(p_template text, p_class text, p_target text,
                                                   p_labels text[])
    RETURNS text
    LANGUAGE sql IMMUTABLE
AS $$
    -- a campaign without such a label is counted under <template>:- (every
    -- campaign of a fair class has its key)
    SELECT coalesce((ledger.resolve_limit_keys(ARRAY[p_template], p_class, p_target, p_labels))[1],
                    p_template || ':-')
     WHERE p_template IS NOT NULL
$$;

-- Every key of p_keys has its row (created uncapped).
CREATE OR REPLACE FUNCTION ledger.ensure_limit_keys(p_keys text[]) RETURNS void
    LANGUAGE sql
AS $$
    WITH made AS (
        INSERT INTO ledger.limit_key (key, updated_at)
        SELECT k, ledger.now() FROM unnest(p_keys) k
        ON CONFLICT (key) DO NOTHING
        RETURNING key
    )
    , shards AS (
        INSERT INTO ledger.limit_shard (key, shard)
        SELECT m.key, s FROM made m, generate_series(0, 7) s
        RETURNING key, shard
    )
    INSERT INTO ledger.limit_given (key, shard, lane)
    SELECT h.key, h.shard, l FROM shards h, generate_series(0, 7) l
$$;

-- The leases of one shard of a key: taken less given back.
--
-- These helpers of the claim path are plpgsql, not SQL: a SQL function with
-- a subquery is not inlined, and called from plpgsql it was planned again
-- on every call (0.9 ms a claim with three keys; bench/limits.py).
CREATE OR REPLACE FUNCTION ledger.shard_leased(p_key text, p_shard smallint, p_taken bigint) RETURNS bigint
    LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN p_taken - coalesce((SELECT sum(g.given) FROM ledger.limit_given g
                                WHERE g.key = p_key AND g.shard = p_shard), 0);
END
$$;

-- A key's leases now: the sum of its shards.
CREATE OR REPLACE FUNCTION ledger.leased_under(p_key text) RETURNS bigint
    LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN coalesce((SELECT sum(s.taken) FROM ledger.limit_shard s WHERE s.key = p_key), 0)
         - coalesce((SELECT sum(g.given) FROM ledger.limit_given g WHERE g.key = p_key), 0);
END
$$;

-- Take a slot of key p_key for a lease (with p_enforce, only in a shard with
-- room under its share of the cap): one no other transaction holds if there
-- is one (this backend's shard first), else the first with room, waited
-- for and tested again. The shard taken, or NULL if none has room.
CREATE OR REPLACE FUNCTION ledger.take_slot(p_key text, p_enforce boolean) RETURNS smallint
    LANGUAGE plpgsql
AS $$
DECLARE
    v_shard smallint;
    v_home integer := pg_catalog.pg_backend_pid() % 8;
BEGIN
    -- one statement: the shard found, locked and taken
    UPDATE ledger.limit_shard u SET taken = u.taken + 1
     WHERE u.key = p_key AND u.shard = (
           SELECT s.shard FROM ledger.limit_shard s
            WHERE s.key = p_key
              AND (NOT p_enforce OR s.max_leased IS NULL
                   OR s.taken - coalesce((SELECT sum(g.given) FROM ledger.limit_given g
                                      WHERE g.key = s.key AND g.shard = s.shard), 0) < s.max_leased)
            ORDER BY (s.shard + 8 - v_home) % 8
            LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING u.shard INTO v_shard;
    IF v_shard IS NOT NULL THEN
        RETURN v_shard;
    END IF;
    IF v_shard IS NULL THEN
        -- every shard with room is held by another transaction (or none has
        -- room): wait for the first; FOR UPDATE tests the row again once it
        -- is ours, and goes on to the next if it filled meanwhile
        SELECT s.shard INTO v_shard FROM ledger.limit_shard s
         WHERE s.key = p_key
           AND (NOT p_enforce OR s.max_leased IS NULL
                OR s.taken - coalesce((SELECT sum(g.given) FROM ledger.limit_given g
                                   WHERE g.key = s.key AND g.shard = s.shard), 0) < s.max_leased)
         ORDER BY s.shard
         LIMIT 1 FOR UPDATE;
        -- (tested again on the row now ours, with what was given back by now)
        IF v_shard IS NOT NULL AND p_enforce AND EXISTS (
               SELECT 1 FROM ledger.limit_shard s
                WHERE s.key = p_key AND s.shard = v_shard AND s.max_leased IS NOT NULL
                  AND ledger.shard_leased(s.key, s.shard, s.taken) >= s.max_leased) THEN
            v_shard := NULL;
        END IF;
    END IF;
    IF v_shard IS NOT NULL THEN
        UPDATE ledger.limit_shard s SET taken = s.taken + 1 WHERE s.key = p_key AND s.shard = v_shard;
    END IF;
    RETURN v_shard;
END
$$;

-- Take one request of resource p_resource's bucket: a shard whose next
-- arrival is past, not held by another transaction if there is one. False
-- if the bucket has no room now.
CREATE OR REPLACE FUNCTION ledger.take_request(p_resource text, p_now timestamptz) RETURNS boolean
    LANGUAGE plpgsql
AS $$
DECLARE
    v_b ledger.limit_bucket;
    v_shard smallint;
BEGIN
    SELECT * INTO v_b FROM ledger.limit_bucket b WHERE b.resource = p_resource;
    IF NOT FOUND THEN
        RETURN true;  -- no such bucket: not limited
    END IF;
    IF v_b.token_tat > p_now THEN
        RETURN false;  -- the reported tokens are ahead of the rate
    END IF;
    IF v_b.requests_per_minute IS NULL THEN
        RETURN true;
    END IF;
    UPDATE ledger.limit_bucket_shard u
       SET request_tat = greatest(u.request_tat, p_now)
                         + make_interval(secs => 60.0 * v_b.shards / v_b.requests_per_minute),
           requests = u.requests + 1
     WHERE u.resource = p_resource AND u.shard = (
           SELECT s.shard FROM ledger.limit_bucket_shard s
            WHERE s.resource = p_resource AND s.shard < v_b.shards AND s.request_tat <= p_now
            ORDER BY (s.shard + 8 - pg_catalog.pg_backend_pid() % 8) % 8
            LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING u.shard INTO v_shard;
    IF v_shard IS NOT NULL THEN
        RETURN true;
    END IF;
    IF v_shard IS NULL THEN
        SELECT s.shard INTO v_shard FROM ledger.limit_bucket_shard s
         WHERE s.resource = p_resource AND s.shard < v_b.shards AND s.request_tat <= p_now
         ORDER BY s.shard LIMIT 1 FOR UPDATE;
    END IF;
    IF v_shard IS NULL THEN
        RETURN false;
    END IF;
    UPDATE ledger.limit_bucket_shard s
       SET request_tat = greatest(s.request_tat, p_now)
                         + make_interval(secs => 60.0 * v_b.shards / v_b.requests_per_minute),
           requests = s.requests + 1
     WHERE s.resource = p_resource AND s.shard = v_shard;
    RETURN true;
END
$$;

-- Fair claims (weighted, across the keys of one class): the keys with ready
-- campaigns in the class, found by a skip scan of campaign_fair_order (one
-- probe per key, not per campaign), the one with the fewest leases for its
-- weight first (ties by name). A light tenant with nothing leased is first
-- in the very next claim, however many campaigns a heavy one has waiting.
CREATE OR REPLACE FUNCTION ledger.fair_keys(p_class text)
    RETURNS TABLE (fair_key text, weight integer)
    LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH RECURSIVE k AS (
        (SELECT r.fair_key FROM ledger.campaign r
          WHERE r.class = p_class AND r.state = 'ready' AND r.fair_key IS NOT NULL
          ORDER BY r.fair_key LIMIT 1)
        UNION ALL
        SELECT (SELECT r.fair_key FROM ledger.campaign r
                 WHERE r.class = p_class AND r.state = 'ready' AND r.fair_key > k.fair_key
                 ORDER BY r.fair_key LIMIT 1)
          FROM k WHERE k.fair_key IS NOT NULL
    ), n AS (
        SELECT k.fair_key, coalesce(lk.weight, 1) AS weight, lk.max_leased,
               ledger.leased_under(k.fair_key) AS leased
          FROM k LEFT JOIN ledger.limit_key lk ON lk.key = k.fair_key
         WHERE k.fair_key IS NOT NULL
    )
    SELECT n.fair_key, n.weight FROM n
     WHERE n.max_leased IS NULL OR n.leased < n.max_leased  -- a key at its cap: skipped whole
     ORDER BY n.leased::double precision / n.weight, n.fair_key;
END
$$;

-- Whether a campaign with these keys and resources may be leased now: no
-- key at its cap of leases or over today's budget, every resource's
-- buckets past their next arrival.
-- (COST 1: evaluated only for the few rows a claim's ordered scan meets,
-- it must not steer the claim off campaign_claim_order; tests/test_claim_plan.py)
CREATE OR REPLACE FUNCTION ledger.limits_open(p_keys text[], p_resources text[], p_now timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql STABLE COST 1
AS $$
BEGIN
    -- (the leases summed in the query itself: one plan, no call per key)
    RETURN NOT EXISTS (SELECT 1 FROM ledger.limit_key k
                        WHERE k.key = ANY (p_keys)
                          AND ((k.max_leased IS NOT NULL
                                AND coalesce((SELECT sum(s.taken) FROM ledger.limit_shard s WHERE s.key = k.key), 0)
                                    - coalesce((SELECT sum(g.given) FROM ledger.limit_given g WHERE g.key = k.key), 0)
                                    >= k.max_leased)
                               OR (k.day = (p_now AT TIME ZONE 'UTC')::date
                                   AND k.day_cost >= k.max_cost_per_day)))
       AND (cardinality(p_resources) = 0 OR ledger.buckets_open(p_resources, p_now));
END
$$;

-- Whether every bucket of these resources has room now (no reported
-- tokens ahead of the rate, a request shard past its next arrival).
CREATE OR REPLACE FUNCTION ledger.buckets_open(p_resources text[], p_now timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN NOT EXISTS (SELECT 1 FROM ledger.limit_bucket b
                        WHERE b.resource = ANY (p_resources)
                          AND (b.token_tat > p_now
                               OR (b.requests_per_minute IS NOT NULL AND NOT EXISTS (
                                       SELECT 1 FROM ledger.limit_bucket_shard s
                                        WHERE s.resource = b.resource AND s.shard < b.shards
                                          AND s.request_tat <= p_now))));
END
$$;

-- (Why a ready campaign waits on its limits, in words -- 'limit repo:app
-- 8/8', 'budget 5.2/5 spent', 'budget tenant:acme 100/100 today', 'rate
-- model-a: requests for 0.5s' -- is the waiting_for column of
-- ledger_api.campaigns: views.sql.)

-- The counters, kept by every state change into or out of leased (and by a
-- change of a campaign's keys): BEFORE the row is written, so that the
-- lease records the shard of each key it holds (limit_shards, in the order
-- of limit_keys) and its ending gives back exactly those. Entering leased by
-- a claim must find room under every cap (ledger.take_slot), keys in their
-- sorted order; a claim also takes one request of each bucket its class
-- uses (ledger.take_request). Either refusing raises LG014: the claim tries
-- its next campaign.
CREATE OR REPLACE FUNCTION ledger.campaign_limit_count() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    v_claim boolean;
    v_shard smallint;
    v_shards smallint[] := '{}';
    v_now timestamptz;
BEGIN
    IF OLD.state = 'leased' AND cardinality(OLD.limit_keys) > 0 THEN
        FOR i IN 1..cardinality(OLD.limit_keys) LOOP
            UPDATE ledger.limit_given g SET given = g.given + 1
             WHERE g.key = OLD.limit_keys[i] AND g.shard = OLD.limit_shards[i]
               AND g.lane = pg_catalog.pg_backend_pid() % 8;
        END LOOP;
    END IF;
    IF NEW.state = 'leased' AND (OLD.state <> 'leased' OR OLD.limit_keys IS DISTINCT FROM NEW.limit_keys) THEN
        v_claim := OLD.state <> 'leased' AND current_setting('ledger.transition', true) = 'claim';
        FOR i IN 1..cardinality(NEW.limit_keys) LOOP
            v_shard := ledger.take_slot(NEW.limit_keys[i], v_claim);
            IF v_shard IS NULL THEN
                RAISE EXCEPTION 'campaign %: limit key % is at its cap', NEW.id, NEW.limit_keys[i]
                    USING ERRCODE = 'LG014';
            END IF;
            v_shards := v_shards || v_shard;
        END LOOP;
        NEW.limit_shards := v_shards;
        IF v_claim AND cardinality(NEW.resources) > 0 THEN
            v_now := ledger.now();
            FOR i IN 1..cardinality(NEW.resources) LOOP
                IF NOT ledger.take_request(NEW.resources[i], v_now) THEN
                    RAISE EXCEPTION 'campaign %: the rate bucket of % is empty', NEW.id, NEW.resources[i]
                        USING ERRCODE = 'LG014';
                END IF;
            END LOOP;
        END IF;
    ELSIF NEW.state <> 'leased' THEN
        NEW.limit_shards := NULL;
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER campaign_limit_count BEFORE UPDATE ON ledger.campaign
    FOR EACH ROW
    WHEN ((OLD.state = 'leased' OR NEW.state = 'leased')
          AND (OLD.state IS DISTINCT FROM NEW.state OR OLD.limit_keys IS DISTINCT FROM NEW.limit_keys)
          AND (cardinality(OLD.limit_keys) > 0 OR cardinality(NEW.limit_keys) > 0
               OR cardinality(NEW.resources) > 0))
    EXECUTE FUNCTION ledger.campaign_limit_count();

-- The same for verifications: a running verification counts under its
-- campaign's keys; a new one must find room under max_verifying.
CREATE OR REPLACE FUNCTION ledger.verification_limit_count() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    v_keys text[];
    v_n integer;
BEGIN
    SELECT c.limit_keys INTO v_keys FROM ledger.campaign c WHERE c.id = NEW.campaign_id;
    IF cardinality(v_keys) = 0 THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.status = 'running' AND NEW.status <> 'running' THEN
        UPDATE ledger.limit_key k SET verifying = k.verifying - 1 WHERE k.key = ANY (v_keys);
    ELSIF NEW.status = 'running' AND (TG_OP = 'INSERT' OR OLD.status <> 'running') THEN
        UPDATE ledger.limit_key k SET verifying = k.verifying + 1
         WHERE k.key = ANY (v_keys) AND (k.max_verifying IS NULL OR k.verifying < k.max_verifying);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_n < cardinality(v_keys) THEN
            RAISE EXCEPTION 'campaign %: a limit key is at its cap of verifications', NEW.campaign_id
                USING ERRCODE = 'LG014';
        END IF;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER verification_limit_start AFTER INSERT ON ledger.verification
    FOR EACH ROW WHEN (NEW.status = 'running')
    EXECUTE FUNCTION ledger.verification_limit_count();
CREATE OR REPLACE TRIGGER verification_limit_end AFTER UPDATE OF status ON ledger.verification
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION ledger.verification_limit_count();

-- No campaign rests in ready over its own budget: a ready campaign whose
-- reported cost reached its max_cost ends in budget_exhausted at once,
-- with the figures (however it got back to ready: a failure, a rejection,
-- a release, the reaper). An AFTER trigger named to fire after the journal
-- trigger of the change that made the row ready, so that change's event
-- comes first; the transition settings of that change are put back after.
CREATE OR REPLACE FUNCTION ledger.campaign_over_budget() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    v_saved text[] := ARRAY[current_setting('ledger.transition', true),
                            current_setting('ledger.actor_role', true),
                            current_setting('ledger.actor', true),
                            current_setting('ledger.detail', true),
                            current_setting('ledger.batch', true)];
    v text;
BEGIN
    PERFORM ledger.begin_transition('exhaust_budget', 'system', 'system',
                jsonb_build_object('reason', 'budget spent', 'cost_spent', NEW.cost_spent,
                                   'max_cost', NEW.max_cost));
    v := set_config('ledger.batch', '', true);
    UPDATE ledger.campaign c SET state = 'budget_exhausted'
     WHERE c.id = NEW.id AND c.state = 'ready' AND c.cost_spent >= c.max_cost;
    v := set_config('ledger.transition', coalesce(v_saved[1], ''), true);
    v := set_config('ledger.actor_role', coalesce(v_saved[2], ''), true);
    v := set_config('ledger.actor', coalesce(v_saved[3], ''), true);
    v := set_config('ledger.detail', coalesce(v_saved[4], ''), true);
    v := set_config('ledger.batch', coalesce(v_saved[5], ''), true);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER campaign_over_budget AFTER UPDATE ON ledger.campaign
    FOR EACH ROW
    WHEN (NEW.state = 'ready' AND NEW.cost_spent >= NEW.max_cost)
    EXECUTE FUNCTION ledger.campaign_over_budget();
