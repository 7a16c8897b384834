-- 0002, after the 0.2.0 schema files: constraints that call functions the
-- files define (ledger.json_within), and data the new tables need.
ALTER TABLE ledger.campaign
    ADD CONSTRAINT campaign_desired_state_bounded
        CHECK (jsonb_typeof(desired_state) = 'object' AND ledger.json_within(desired_state, 32, 262144))
        NOT VALID,
    ADD CONSTRAINT campaign_opening_observation_bounded
        CHECK (jsonb_typeof(opening_observation) = 'object'
               AND ledger.json_within(opening_observation, 33, 266240)) NOT VALID;
ALTER TABLE ledger.campaign VALIDATE CONSTRAINT campaign_desired_state_bounded;
ALTER TABLE ledger.campaign VALIDATE CONSTRAINT campaign_opening_observation_bounded;
ALTER TABLE ledger.observation
    ADD CONSTRAINT observation_details_bounded
        CHECK (jsonb_typeof(details) = 'object' AND ledger.json_within(details, 32, 262144)) NOT VALID;
ALTER TABLE ledger.observation VALIDATE CONSTRAINT observation_details_bounded;

-- Promotions a 0.1.0 dispatcher had not carried out yet join their target's
-- merge queue in the order they were asked for (merge_queue_enter queues
-- only intents written from now on).
INSERT INTO ledger.merge_queue (campaign_id, repository, ref, queued_at)
SELECT s.campaign_id, coalesce(s.payload ->> 'repository', ''), s.target, s.created_at
  FROM ledger.side_effect s
  JOIN ledger.campaign c ON c.id = s.campaign_id AND c.generation = s.generation
 WHERE s.purpose = 'promotion' AND s.kind = 'git.update_ref' AND s.state IN ('pending', 'claimed')
   AND c.state = 'verified'
 ORDER BY s.id
ON CONFLICT (campaign_id) DO NOTHING;
