-- 0002 down
DROP TABLE IF EXISTS ledger.campaign_event, ledger.security_event, ledger.side_effect,
    ledger.verification, ledger.attempt, ledger.observation, ledger.campaign,
    ledger.campaign_class, ledger.transition, ledger.actor, ledger.state;
