-- 0010: the campaign's document bounds leave the table's CHECKs for the
-- guard trigger (campaign.sql, ledger.check_documents), which tests them
-- where a document is written instead of on every UPDATE. Rows already
-- there passed the CHECKs: nothing to test again.
ALTER TABLE ledger.campaign
    DROP CONSTRAINT IF EXISTS campaign_desired_state_bounded,
    DROP CONSTRAINT IF EXISTS campaign_opening_observation_bounded;
