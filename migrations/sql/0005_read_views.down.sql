-- 0005 down
DROP VIEW IF EXISTS ledger_api.transitions, ledger_api.states, ledger_api.classes,
    ledger_api.security_events, ledger_api.side_effects, ledger_api.verifications,
    ledger_api.observations, ledger_api.events, ledger_api.attempts, ledger_api.campaigns;
