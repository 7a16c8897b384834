-- 0002 down: the queue's tables, triggers and functions go. The bodies of
-- claim_side_effect, reject and rebase_promotion that call them are the
-- current files' (a downgrade cannot bring back an older body: see
-- CONTRIBUTING.md); re-apply the 0001 release's files to run without a queue.
DROP TRIGGER IF EXISTS side_effect_merge_queue_enter ON ledger.side_effect;
DROP TRIGGER IF EXISTS side_effect_merge_queue_leave ON ledger.side_effect;
DROP TRIGGER IF EXISTS campaign_merge_queue ON ledger.campaign;
DROP FUNCTION IF EXISTS ledger_api.merge_queue_view(bigint, bigint, integer);
DROP FUNCTION IF EXISTS ledger_api.merge_queue_stack(bigint, bigint, text, bigint[], bigint[], text[], jsonb, integer, jsonb, text, bytea, text);
DROP FUNCTION IF EXISTS ledger_api.merge_queue_freeze(bigint, bigint, bigint, text[]);
DROP FUNCTION IF EXISTS ledger_api.merge_queue_landed(bigint, bigint, bigint, text, text);
DROP FUNCTION IF EXISTS ledger_api.merge_queue_dissolve(bigint, bigint, bigint, text);
DROP FUNCTION IF EXISTS ledger.merge_queue_change(bigint, ledger.side_effect);
DROP FUNCTION IF EXISTS ledger.merge_queue_policy(text);
DROP TABLE IF EXISTS ledger.merge_batch;
DROP TABLE IF EXISTS ledger.merge_queue;
DROP SEQUENCE IF EXISTS ledger.merge_queue_position;
DROP FUNCTION IF EXISTS ledger.merge_queue_turn(ledger.side_effect);
DROP FUNCTION IF EXISTS ledger.merge_queue_requeue(ledger.verification, text, jsonb);
DROP FUNCTION IF EXISTS ledger.rebase_verified(ledger.campaign, ledger.side_effect, text, text, text, jsonb, text, text, bytea, text, text);
DROP FUNCTION IF EXISTS ledger.merge_queue_enter();
DROP FUNCTION IF EXISTS ledger.merge_queue_landed_leaves();
DROP FUNCTION IF EXISTS ledger.merge_queue_campaign_moved();
DELETE FROM ledger.transition WHERE name = 'requeue';
