-- Reads of ledger_api.processes, the registry of processes (ledger.registry).

-- name: processes
-- Every process of the registry (at most limit): the live first, by role,
-- then host and pid; the gone and the stopped after them.
SELECT * FROM ledger_api.processes
 ORDER BY status = 'live' DESC, role, host, pid, started_at DESC
 LIMIT %(limit)s::bigint;
