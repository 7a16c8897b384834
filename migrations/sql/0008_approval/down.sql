-- 0008 down: approvals go -- refused while a campaign awaits one (decide it
-- first) -- and the previous copies of the files put the functions back as
-- they were (the two whose arguments grew are dropped here for that).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM ledger.campaign WHERE state = 'awaiting_approval') THEN
        RAISE EXCEPTION 'campaigns await approval: decide them first (ledger approve, ledger deny)'
            USING ERRCODE = 'LG002';
    END IF;
END
$$;
DROP VIEW IF EXISTS ledger_api.approvals;
DROP VIEW IF EXISTS ledger_api.classes;  -- put back without its approval column
DROP FUNCTION IF EXISTS ledger_api.approve(bigint, text, text);
DROP FUNCTION IF EXISTS ledger_api.deny(bigint, text, text, boolean);
DROP FUNCTION IF EXISTS ledger_api.expire_approvals(integer);
DROP FUNCTION IF EXISTS ledger_api.claim_side_effect(text, double precision, text[], boolean);
DROP FUNCTION IF EXISTS ledger_api.register_class(text, integer, double precision, double precision,
                                                  double precision, double precision, double precision,
                                                  text, jsonb, jsonb, jsonb, text, integer,
                                                  double precision, text[], jsonb);
DROP TRIGGER IF EXISTS campaign_approval ON ledger.campaign;
DROP TRIGGER IF EXISTS side_effect_promotion_approved ON ledger.side_effect;
DROP FUNCTION IF EXISTS ledger.campaign_approval();
DROP FUNCTION IF EXISTS ledger.promotion_needs_approval();
DROP FUNCTION IF EXISTS ledger.glob_matches(text, text);
DROP FUNCTION IF EXISTS ledger.check_approval_policy(jsonb);
DROP FUNCTION IF EXISTS ledger.approval_reasons(ledger.campaign, ledger.attempt);
DROP FUNCTION IF EXISTS ledger.request_promotion(bigint, bigint, jsonb, text, text);
DROP FUNCTION IF EXISTS ledger.request_approval(bigint, bigint, jsonb, jsonb);
DROP FUNCTION IF EXISTS ledger.decide_approval(ledger.campaign, ledger.approval, text, text, text, text, text);
DROP FUNCTION IF EXISTS ledger.operator_decision(bigint, text, text, text);
DROP TABLE IF EXISTS ledger.approval;
DROP FUNCTION IF EXISTS ledger.approval_decided_once();
ALTER TABLE ledger.campaign_class DROP COLUMN IF EXISTS approval;
DELETE FROM ledger.transition WHERE from_state = 'awaiting_approval' OR to_state = 'awaiting_approval';
DELETE FROM ledger.state WHERE name = 'awaiting_approval';
UPDATE ledger.state SET position = position + 100 WHERE position >= 6;
UPDATE ledger.state SET position = position - 101 WHERE position >= 100;
