-- 0011 down: limits and budgets go -- refused while a campaign is
-- budget_exhausted (raise its budget or abandon it first) -- and the
-- previous copies of the files put the functions and views back as they
-- were.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger.campaign WHERE state = 'budget_exhausted') THEN
        RAISE EXCEPTION 'campaigns are budget_exhausted: raise their budgets or abandon them first'
            USING ERRCODE = 'LG002';
    END IF;
END
$$;
DROP VIEW IF EXISTS ledger_api.limit_keys;
DROP VIEW IF EXISTS ledger_api.limit_buckets;
DROP VIEW IF EXISTS ledger_api.attempt_usage;
DROP VIEW IF EXISTS ledger_api.limit_events;
DROP VIEW IF EXISTS ledger_api.campaigns;  -- put back without the limits' columns
DROP VIEW IF EXISTS ledger_api.classes;
DROP FUNCTION IF EXISTS ledger_api.set_limit(text, integer, integer, double precision, integer, text);
DROP FUNCTION IF EXISTS ledger_api.set_bucket(text, double precision, double precision, text);
DROP FUNCTION IF EXISTS ledger_api.set_class_limits(text, text[], text[], double precision, text, text);
DROP FUNCTION IF EXISTS ledger.fair_keys(text);
DROP FUNCTION IF EXISTS ledger.resolve_fair_key(text, text, text, text[]);
DROP FUNCTION IF EXISTS ledger_api.raise_budget(bigint, double precision, text, text);
DROP FUNCTION IF EXISTS ledger_api.report_usage(bigint, bigint, bigint, bigint, bigint, double precision, text);
DROP TRIGGER IF EXISTS campaign_limit_count ON ledger.campaign;
DROP TRIGGER IF EXISTS campaign_over_budget ON ledger.campaign;
DROP TRIGGER IF EXISTS verification_limit_start ON ledger.verification;
DROP TRIGGER IF EXISTS verification_limit_end ON ledger.verification;
DROP FUNCTION IF EXISTS ledger.campaign_limit_count();
DROP FUNCTION IF EXISTS ledger.verification_limit_count();
DROP FUNCTION IF EXISTS ledger.campaign_over_budget();
DROP FUNCTION IF EXISTS ledger.limits_open(text[], text[], timestamptz);
DROP FUNCTION IF EXISTS ledger.buckets_open(text[], timestamptz);
DROP FUNCTION IF EXISTS ledger.ensure_limit_keys(text[]);
DROP FUNCTION IF EXISTS ledger.leased_under(text);
DROP FUNCTION IF EXISTS ledger.shard_leased(text, smallint, bigint);
DROP FUNCTION IF EXISTS ledger.take_slot(text, boolean);
DROP FUNCTION IF EXISTS ledger.take_request(text, timestamptz);
DROP FUNCTION IF EXISTS ledger.resolve_limit_keys(text[], text, text, text[]);
DROP FUNCTION IF EXISTS ledger.limit_journal(text, text, text, text, jsonb);
DROP TABLE IF EXISTS ledger.limit_event;
DROP FUNCTION IF EXISTS ledger.limit_event_append_only();
DROP TABLE IF EXISTS ledger.attempt_usage;
DROP TABLE IF EXISTS ledger.limit_bucket_shard;
DROP TABLE IF EXISTS ledger.limit_bucket;
DROP TABLE IF EXISTS ledger.limit_given;
DROP TABLE IF EXISTS ledger.limit_shard;
DROP TABLE IF EXISTS ledger.limit_key;
ALTER TABLE ledger.campaign
    DROP COLUMN IF EXISTS limit_keys, DROP COLUMN IF EXISTS resources,
    DROP COLUMN IF EXISTS max_cost, DROP COLUMN IF EXISTS cost_spent, DROP COLUMN IF EXISTS fair_key,
    DROP COLUMN IF EXISTS limit_shards;
ALTER TABLE ledger.campaign_class
    DROP COLUMN IF EXISTS limit_keys, DROP COLUMN IF EXISTS resources, DROP COLUMN IF EXISTS max_cost,
    DROP COLUMN IF EXISTS fair_key;
DELETE FROM ledger.transition WHERE from_state = 'budget_exhausted' OR to_state = 'budget_exhausted';
DELETE FROM ledger.state WHERE name = 'budget_exhausted';
UPDATE ledger.state SET position = position + 100 WHERE position >= 8;
UPDATE ledger.state SET position = position - 101 WHERE position >= 100;
