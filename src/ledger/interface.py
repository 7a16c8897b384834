"""Ledger's public names, listed once: what dashboards, alerts and scripts are
built on -- OpenTelemetry span names and attributes, Prometheus metric
families, exit codes and the fields of the CLI's ``--json`` output.

Nothing imports these lists to emit a name: the code declares its names where
it emits them, and tests/test_interface_names.py fails if the code emits a
name missing here or a name listed here is no longer emitted. A rename is then
a change to this file too, in plain sight of the review (and the CHANGELOG).
"""

from __future__ import annotations

#: Span names (``ledger.tracing``; docs/tracing.md).
SPANS = frozenset({
    "ledger.open", "ledger.observation", "ledger.attempt", "ledger.claim",
    "ledger.verification", "ledger.promotion", "ledger.side_effect",
})

#: Span attribute keys (``ledger.tracing``; docs/tracing.md).
SPAN_ATTRIBUTES = frozenset({
    "ledger.campaign.id", "ledger.campaign.class", "ledger.campaign.generation",
    "ledger.attempt.number", "ledger.verdict", "ledger.outcome", "ledger.objective_key",
    "ledger.observation.status", "ledger.sensor", "ledger.worker", "ledger.verifier",
    "ledger.verification.id", "ledger.verification.kind", "ledger.dispatcher",
    "ledger.side_effect.id", "ledger.side_effect.kind", "ledger.side_effect.purpose",
    "ledger.side_effect.tries",
})

#: Metric families as scraped from ``GET /metrics`` (counters with ``_total``),
#: each with its labels (docs/reference/metrics.md, generated).
METRICS: dict[str, frozenset[str]] = {
    "ledger_campaigns": frozenset({"class", "state"}),
    "ledger_campaigns_waiting": frozenset({"class", "reason"}),
    "ledger_approvals_waiting": frozenset({"class"}),
    "ledger_approval_oldest_age_seconds": frozenset({"class"}),
    "ledger_approval_decisions_total": frozenset({"decision", "by"}),
    "ledger_oldest_ready_age_seconds": frozenset(),
    "ledger_transitions_total": frozenset({"transition"}),
    "ledger_claims_total": frozenset(),
    "ledger_lease_expiries_total": frozenset(),
    "ledger_attempts_total": frozenset({"outcome"}),
    "ledger_attempts_running": frozenset(),
    "ledger_verdicts_total": frozenset({"verdict"}),
    "ledger_side_effects_total": frozenset({"kind"}),
    "ledger_side_effects_by_state": frozenset({"kind", "state"}),
    "ledger_sensor_observations_total": frozenset({"sensor", "outcome"}),
    "ledger_sensor_consecutive_errors": frozenset({"sensor"}),
    "ledger_attempt_duration_seconds": frozenset(),
    "ledger_verification_duration_seconds": frozenset(),
    "ledger_processes_not_ready": frozenset({"role"}),
    "ledger_notify_queue_usage": frozenset(),
    "ledger_hub_reconnects_total": frozenset(),
    "ledger_hub_connected": frozenset(),
    "ledger_hub_deaf": frozenset(),
    "ledger_hub_missed_round_trips_total": frozenset(),
    "ledger_hub_dropped_notifications_total": frozenset(),
    "ledger_http_requests_total": frozenset({"method", "route", "status"}),
    "ledger_http_request_duration_seconds": frozenset({"method", "route"}),
    "ledger_metrics_read_seconds": frozenset(),
    "ledger_limit_leased": frozenset({"key"}),
    "ledger_limit_max_leased": frozenset({"key"}),
    "ledger_limit_verifying": frozenset({"key"}),
    "ledger_limit_cost_today": frozenset({"key"}),
    "ledger_bucket_requests_total": frozenset({"resource"}),
    "ledger_bucket_tokens_total": frozenset({"resource"}),
    "ledger_bucket_wait_seconds": frozenset({"resource"}),
    "ledger_usage_tokens_total": frozenset({"class", "direction"}),
    "ledger_usage_cost_total": frozenset({"class"}),
    "ledger_campaigns_waiting_on_limits": frozenset({"class", "kind"}),
}

#: The exit codes of ``ledger`` (their meanings: ``ledger --help``,
#: docs/reference/errors.md).
EXIT_CODES = frozenset({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                        69, 70, 74, 75, 78, 130})

_CAMPAIGN = frozenset({
    "id", "class", "objective_key", "target", "desired_state", "opening_observation", "state",
    "lease_owner", "leased_at", "lease_expires_at", "generation", "attempt_count",
    "max_attempts", "next_attempt_at", "last_failure_reason", "acceptance_criteria",
    "evidence_location", "seat", "priority", "labels", "event_seq", "promoted_at",
    "promoted_sha", "created_at", "updated_at", "closed_at", "fault_count", "trace_context",
    "waiting_on", "waiting_reason", "waiting_since",
    "limit_keys", "resources", "max_cost", "cost_spent", "fair_key", "waiting_for",
})

#: The fields of ``--json`` output, per command (a list's: of each item;
#: ``status.sensors`` and the like: of each item of that key).
CLI_JSON: dict[str, frozenset[str]] = {
    "open": frozenset({"campaign_id", "created", "state", "generation"}),
    "list": _CAMPAIGN,
    "show": frozenset({"campaign", "attempts", "verifications", "side_effects",
                       "observations", "approvals"}),
    "show.campaign": _CAMPAIGN,
    "status": frozenset({"states", "oldest_ready", "leases_expiring", "sensors", "not_ready",
                         "waiting_on_limits"}),
    "status.leases_expiring": frozenset({"campaign_id", "lease_owner", "lease_expires_at"}),
    "status.sensors": frozenset({"sensor", "last_outcome", "effect", "observed_at",
                                 "campaign_id", "consecutive_errors", "last_error",
                                 "last_error_at"}),
    "status.not_ready": frozenset({"role", "service", "host", "pid", "started_at",
                                   "not_ready"}),
    "status.waiting_on_limits": frozenset({"class", "kind", "campaigns", "waiting_for"}),
}
