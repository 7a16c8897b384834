-- Reads of ledger_api.processes, the registry of processes (ledger.registry).

-- name: processes
-- Every process of the registry (at most limit): the live first, by role,
-- then host and pid; the gone and the stopped after them.
SELECT * FROM ledger_api.processes
 ORDER BY status = 'live' DESC, role, host, pid, started_at DESC
 LIMIT %(limit)s::bigint;

-- name: processes_not_ready
-- The live processes that wait to start (their host or their configuration is
-- not ready for them: ledger.runtime.startup), the longest waiting first.
SELECT * FROM ledger_api.processes
 WHERE status = 'live' AND not_ready IS NOT NULL
 ORDER BY started_at, role, host, pid
 LIMIT %(limit)s::bigint;
