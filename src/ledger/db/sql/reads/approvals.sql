-- Reads of ledger_api.approvals (see campaigns.sql for the conventions).

-- name: approvals_of
-- A campaign's approvals, oldest first.
SELECT * FROM ledger_api.approvals WHERE campaign_id = %(campaign_id)s::bigint ORDER BY id;

-- name: approvals_waiting
-- The approvals no one has decided yet, the oldest first (at most limit),
-- with their campaigns' class and objective (the approvals list of the CLI,
-- the API and the dashboard; optionally of one class).
SELECT ap.*, c.class, c.objective_key, c.target
  FROM ledger_api.approvals ap
  JOIN ledger_api.campaigns c ON c.id = ap.campaign_id
 WHERE ap.decision IS NULL
   AND (%(class)s::text IS NULL OR c.class = %(class)s::text)
 ORDER BY ap.requested_at, ap.id
 LIMIT %(limit)s::integer;

-- name: approval_backlog
-- Per class: how many approvals wait and the age of the oldest, in seconds
-- (the metrics' ledger_approvals_waiting and ledger_approval_oldest_age_seconds).
SELECT c.class, count(*) AS waiting,
       extract(epoch FROM statement_timestamp() - min(ap.requested_at))::float8 AS oldest_age_s
  FROM ledger_api.approvals ap
  JOIN ledger_api.campaigns c ON c.id = ap.campaign_id
 WHERE ap.decision IS NULL
 GROUP BY c.class
 ORDER BY c.class;

-- name: approval_decisions
-- Decided approvals per (decision, role that decided): a counter (approvals
-- are never deleted).
SELECT decision, decided_role, count(*) AS count
  FROM ledger_api.approvals
 WHERE decision IS NOT NULL
 GROUP BY decision, decided_role
 ORDER BY decision, decided_role;
