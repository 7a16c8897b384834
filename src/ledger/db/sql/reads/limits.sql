-- Reads of the limits' views (limits.sql; see campaigns.sql for the
-- conventions).

-- name: limit_keys
-- Every limit key: its caps, its use, today's spend.
SELECT * FROM ledger_api.limit_keys ORDER BY key;

-- name: limit_buckets
-- Every rate-limited resource: its rates, what it gave out, the wait now.
SELECT * FROM ledger_api.limit_buckets ORDER BY resource;

-- name: limit_events
-- Changes of the limits (a key's caps, a bucket's rates, a class's limits,
-- a budget raised), newest first.
SELECT * FROM ledger_api.limit_events ORDER BY id DESC LIMIT %(limit)s::bigint;

-- name: campaign_usage
-- What each attempt of a campaign reported it used, oldest first.
SELECT * FROM ledger_api.attempt_usage WHERE campaign_id = %(campaign_id)s::bigint ORDER BY generation;

-- name: usage_by_class
-- Usage per class: in all, and today (UTC); the campaigns waiting on a limit.
SELECT u.class,
       sum(u.tokens_in)::bigint AS tokens_in, sum(u.tokens_out)::bigint AS tokens_out,
       sum(u.requests)::bigint AS requests, sum(u.cost)::double precision AS cost,
       coalesce(sum(u.cost) FILTER (WHERE u.last_at >= date_trunc('day', statement_timestamp() AT TIME ZONE 'UTC')
                                                         AT TIME ZONE 'UTC'), 0)::double precision AS cost_today,
       count(*)::bigint AS attempts
  FROM ledger_api.attempt_usage u
 GROUP BY u.class
 ORDER BY u.class;

-- name: limits_waiting
-- How many ready campaigns wait on each kind of limit (limit, rate, budget),
-- with one of their reasons ('limit repo:app 8/8').
SELECT c.class, split_part(c.waiting_for, ' ', 1) AS kind, count(*)::bigint AS campaigns,
       min(c.waiting_for) AS example
  FROM ledger_api.campaigns c
 WHERE c.waiting_for IS NOT NULL
 GROUP BY c.class, split_part(c.waiting_for, ' ', 1)
 ORDER BY c.class, kind;
