-- The contract: ledger_api.states and ledger_api.transitions (the state
-- machine, from the database).

-- name: states
SELECT * FROM ledger_api.states ORDER BY position;

-- name: transitions
SELECT * FROM ledger_api.transitions ORDER BY name, from_state NULLS FIRST;
