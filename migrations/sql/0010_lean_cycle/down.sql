-- 0010 down: the documents' bounds as CHECKs again (every row passed the
-- guard's test of them); campaign.sql, merge_queue.sql and api_worker.sql
-- as 0009 left them are put back after this.
DROP FUNCTION IF EXISTS ledger.check_documents(ledger.campaign);
ALTER TABLE ledger.campaign
    ADD CONSTRAINT campaign_desired_state_bounded
        CHECK (jsonb_typeof(desired_state) = 'object'
               AND ledger.json_within(desired_state, 32, 262144)) NOT VALID,
    ADD CONSTRAINT campaign_opening_observation_bounded
        CHECK (jsonb_typeof(opening_observation) = 'object'
               AND ledger.json_within(opening_observation, 33, 266240)) NOT VALID;
ALTER TABLE ledger.campaign VALIDATE CONSTRAINT campaign_desired_state_bounded;
ALTER TABLE ledger.campaign VALIDATE CONSTRAINT campaign_opening_observation_bounded;
