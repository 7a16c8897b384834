-- Read views
--
-- The read side: views in ledger_api, owned by the owner, SELECT granted to the
-- reader role in grants.sql (every runtime role is a member of it). Columns are
-- listed so a new table column is not exposed by accident.

CREATE OR REPLACE VIEW ledger_api.campaigns AS
SELECT id, class, objective_key, target, desired_state, opening_observation, state,
       lease_owner, leased_at, lease_expires_at, generation, attempt_count, max_attempts,
       next_attempt_at, last_failure_reason, acceptance_criteria, evidence_location, seat,
       priority, labels, event_seq, promoted_at, promoted_sha, created_at, updated_at, closed_at,
       waiting_on, waiting_reason, waiting_since, fault_count, trace_context,
       limit_keys, resources, max_cost, cost_spent, fair_key,
       -- what its limits hold it back by ('limit repo:app 8/8', limits.sql)
       CASE WHEN c.state IN ('ready', 'budget_exhausted')
                 AND (cardinality(c.limit_keys) > 0 OR cardinality(c.resources) > 0 OR c.max_cost IS NOT NULL)
            THEN CASE WHEN c.cost_spent >= c.max_cost
                      THEN format('budget %s/%s spent', trim_scale(round(c.cost_spent, 4)), trim_scale(round(c.max_cost, 4)))
                      ELSE coalesce(
                          (SELECT format('limit %s %s/%s', k.key, n.leased, k.max_leased)
                             FROM ledger.limit_key k
                            CROSS JOIN LATERAL (SELECT coalesce((SELECT sum(s.taken) FROM ledger.limit_shard s
                                                                  WHERE s.key = k.key), 0)
                                                     - coalesce((SELECT sum(g.given) FROM ledger.limit_given g
                                                                  WHERE g.key = k.key), 0) AS leased) n
                            WHERE k.key = ANY (c.limit_keys) AND k.max_leased IS NOT NULL
                              AND n.leased >= k.max_leased
                            ORDER BY k.key LIMIT 1),
                          (SELECT format('budget %s %s/%s today', k.key, trim_scale(round(k.day_cost, 4)),
                                         trim_scale(round(k.max_cost_per_day, 4)))
                             FROM ledger.limit_key k
                            WHERE k.key = ANY (c.limit_keys) AND k.day_cost >= k.max_cost_per_day
                              AND k.day = (statement_timestamp() AT TIME ZONE 'UTC')::date
                            ORDER BY k.key LIMIT 1),
                          (SELECT format('rate %s: %s for %ss', b.resource,
                                         CASE WHEN b.token_tat > statement_timestamp() THEN 'tokens'
                                              ELSE 'requests' END,
                                         round(extract(epoch FROM greatest(q.next_at, b.token_tat)
                                                                  - statement_timestamp()), 3))
                             FROM ledger.limit_bucket b
                            CROSS JOIN LATERAL (SELECT CASE WHEN b.requests_per_minute IS NULL THEN '-infinity'
                                                            ELSE min(s.request_tat) END AS next_at
                                                  FROM ledger.limit_bucket_shard s
                                                 WHERE s.resource = b.resource AND s.shard < b.shards) q
                            WHERE b.resource = ANY (c.resources)
                              AND greatest(q.next_at, b.token_tat) > statement_timestamp()
                            ORDER BY b.resource LIMIT 1)) END
       END AS waiting_for
  FROM ledger.campaign c;

CREATE OR REPLACE VIEW ledger_api.attempts AS
SELECT id, campaign_id, attempt_no, generation, worker, claimed_at, lease_expires_at,
       last_heartbeat_at, heartbeat_count, outcome, verdict, ended_at, failure_reason,
       fingerprint, base_sha, candidate_sha, bundle, bundle_digest, log_tail, candidate_ref,
       octet_length(diff) AS diff_bytes
  FROM ledger.attempt;

-- A candidate's diff (the evidence a verifier, a dispatcher rebasing it and
-- the dashboard read), apart from the attempts view so that listing attempts
-- does not carry every diff along.
CREATE OR REPLACE VIEW ledger_api.attempt_diffs AS
SELECT campaign_id, attempt_no, generation, candidate_ref, diff
  FROM ledger.attempt
 WHERE diff IS NOT NULL;

CREATE OR REPLACE VIEW ledger_api.events AS
SELECT campaign_id, seq, type, actor, generation, delta, payload, created_at, actor_role
  FROM ledger.campaign_event;

CREATE OR REPLACE VIEW ledger_api.observations AS
SELECT id, sensor, target, objective_key, class, status, started_at, finished_at, tick, details,
       campaign_id, effect, idempotency_key, recorded_at, reason
  FROM ledger.observation;

CREATE OR REPLACE VIEW ledger_api.verifications AS
SELECT id, campaign_id, attempt_id, generation, verifier, model_family, status, claimed_at,
       lease_expires_at, finished_at, reason, evidence, kind
  FROM ledger.verification;

CREATE OR REPLACE VIEW ledger_api.side_effects AS
SELECT id, campaign_id, generation, kind, purpose, target, precondition, payload,
       idempotency_key, requested_by, requested_role, state, claimed_by, lease_expires_at,
       tries, next_try_at, result, error, created_at, updated_at, finished_at
  FROM ledger.side_effect;

CREATE OR REPLACE VIEW ledger_api.security_events AS
SELECT id, at, actor_role, actor, campaign_id, action, target, reason, details
  FROM ledger.security_event;

CREATE OR REPLACE VIEW ledger_api.classes AS
SELECT name, max_attempts, lease_seconds, backoff_base_s, backoff_factor, backoff_cap_s,
       backoff_jitter, seat_policy, authority, acceptance, promotion, verifier,
       created_at, updated_at, weight, heartbeat_seconds, paused_at, verifiers, approval,
       limit_keys, resources, max_cost, fair_key
  FROM ledger.campaign_class;

-- Limits (limits.sql): each key's use against its caps and today's spend;
-- each bucket's rates and how long a claim would wait on it now.
CREATE OR REPLACE VIEW ledger_api.limit_keys AS
SELECT k.key, k.max_leased, k.max_verifying, k.max_cost_per_day, k.weight,
       (coalesce((SELECT sum(s.taken) FROM ledger.limit_shard s WHERE s.key = k.key), 0)
        - coalesce((SELECT sum(g.given) FROM ledger.limit_given g WHERE g.key = k.key), 0))::integer AS leased,
       k.verifying,
       CASE WHEN k.day = (statement_timestamp() AT TIME ZONE 'UTC')::date THEN k.day_cost ELSE 0 END AS cost_today,
       k.cost_total, k.updated_at, k.updated_by
  FROM ledger.limit_key k;

CREATE OR REPLACE VIEW ledger_api.limit_buckets AS
SELECT b.resource, b.requests_per_minute, b.tokens_per_minute,
       (SELECT coalesce(sum(s.requests), 0) FROM ledger.limit_bucket_shard s
         WHERE s.resource = b.resource)::bigint AS requests,
       b.tokens,
       coalesce((SELECT CASE WHEN min(s.request_tat) > statement_timestamp()
                             THEN extract(epoch FROM min(s.request_tat) - statement_timestamp()) ELSE 0 END
                   FROM ledger.limit_bucket_shard s
                  WHERE s.resource = b.resource AND s.shard < b.shards AND b.requests_per_minute IS NOT NULL),
                0)::double precision AS request_wait_s,
       CASE WHEN b.token_tat > statement_timestamp()
            THEN extract(epoch FROM b.token_tat - statement_timestamp()) ELSE 0 END::double precision
           AS token_wait_s,
       b.updated_at, b.updated_by
  FROM ledger.limit_bucket b;

CREATE OR REPLACE VIEW ledger_api.attempt_usage AS
SELECT campaign_id, generation, attempt_no, class, tokens_in, tokens_out, requests, cost, reports,
       first_at, last_at
  FROM ledger.attempt_usage;

CREATE OR REPLACE VIEW ledger_api.limit_events AS
SELECT id, at, type, subject, actor, actor_role, detail FROM ledger.limit_event;

-- Approvals asked for and how each was decided (approval.sql), with the
-- promotion an approval requested (NULL until then, or if there is none).
CREATE OR REPLACE VIEW ledger_api.approvals AS
SELECT ap.id, ap.campaign_id, ap.generation, ap.attempt_id, ap.reasons, ap.promotion,
       ap.requested_at, ap.deadline, ap.on_timeout, ap.decision, ap.decided_by, ap.decided_role,
       ap.decided_by_transition, ap.decision_reason, ap.decided_at,
       (SELECT s.id FROM ledger.side_effect s
         WHERE s.campaign_id = ap.campaign_id AND s.generation = ap.generation
           AND s.purpose = 'promotion' ORDER BY s.id LIMIT 1) AS side_effect_id
  FROM ledger.approval ap;

CREATE OR REPLACE VIEW ledger_api.class_events AS
SELECT id, class, type, actor, actor_role, reason, created_at FROM ledger.class_event;

-- The registry of processes, with how each reads now: live, stopped (it said
-- so on its way out) or gone (three of its report intervals have passed, and
-- five seconds, without a word: killed, hung, or cut off from the database);
-- not_ready: why a live one waits to start (its host or its configuration).
CREATE OR REPLACE VIEW ledger_api.processes AS
SELECT role, host, pid, started_at, identity, service, interval_s, holds, last_seen, stopped_at,
       CASE WHEN stopped_at IS NOT NULL THEN 'stopped'
            WHEN last_seen < statement_timestamp() - make_interval(secs => 3 * interval_s + 5)
            THEN 'gone'
            ELSE 'live' END AS status,
       not_ready
  FROM ledger.process;

CREATE OR REPLACE VIEW ledger_api.states AS
SELECT name, is_terminal, position, description FROM ledger.state;

CREATE OR REPLACE VIEW ledger_api.transitions AS
SELECT t.name, t.from_state, t.to_state, t.owner_role, a.db_role, t.note
  FROM ledger.transition t JOIN ledger.actor a ON a.name = t.owner_role;

CREATE OR REPLACE VIEW ledger_api.sensor_ticks AS
SELECT sensor, tick, claimed_by, claimed_at FROM ledger.sensor_tick;

CREATE OR REPLACE VIEW ledger_api.sensors AS
SELECT name, registered_at, registered_by FROM ledger.sensor;
