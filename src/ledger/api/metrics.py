"""``GET /metrics``: Prometheus text, computed from the database at scrape time.

Nothing is counted in process memory (but the hub's reconnects and this
process's requests, which are about this process): every server reports the
same campaign numbers, and a restart resets nothing. Counters are derived from
rows that only grow -- journal transitions, ended attempts, verdicts, side-effect
intents -- so they are monotonic. Labels are bounded (state, transition,
outcome, kind): never a campaign id.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ledger.api import problems
from ledger.api.roles import CallerDep
from ledger.db.hub import Hub
from ledger.db.models import ClassUsage, LimitBucket, LimitKey, ProcessRow
from ledger.db.reads import Reads

router = APIRouter(tags=["metrics"])

#: Upper bounds (seconds) of the duration histograms' buckets.
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)

Buckets = list[tuple[float, int, float]]
#: Upper bounds (seconds) of the HTTP request-duration histogram's buckets.
#: The methods counted by name; any other is ``other``.
STANDARD_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS",
                              "TRACE", "CONNECT"})
#: Why a campaign waits (``campaign.waiting_on``), each a label of the waiting gauge.
WAITING_REASONS = ("system_fault", "target")
#: The most limit keys a scrape reports (those with a cap or a budget, by name).
LIMIT_KEYS = 1000
#: The sensors whose streak of errors a scrape reports (by name).
SENSOR_LIMIT = 1000
#: An observation's outcomes, each a label of the sensors' counter.
OUTCOMES = ("green", "red", "error")
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Snapshot:
    """What one scrape read from the database."""

    states: dict[str, int]
    class_states: dict[tuple[str, str], int]
    oldest_ready_age_s: float | None
    transitions: dict[str, int]
    attempts: dict[str, int]
    verifications: dict[str, int]
    side_effects: dict[tuple[str, str], int]
    attempt_durations: Buckets
    verification_durations: Buckets
    notify_queue_usage: float = 0.0
    #: (class, reason) -> campaigns held back by what is not their attempt's
    #: own: a system fault, or their target (a dirty checkout)
    waiting: dict[tuple[str, str], int] = field(default_factory=dict)
    #: (sensor, outcome) -> observations recorded: green, red, error
    sensor_outcomes: dict[tuple[str, str], int] = field(default_factory=dict)
    #: sensor -> errors recorded in a row since its latest green or red
    sensor_errors: dict[str, int] = field(default_factory=dict)
    #: class -> (undecided approvals, the oldest one's age in seconds)
    approvals: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: (decision, role that decided) -> decided approvals
    approval_decisions: dict[tuple[str, str], int] = field(default_factory=dict)
    #: role -> live processes that wait to start (ledger.runtime.startup)
    not_ready: dict[str, int] = field(default_factory=dict)
    #: limits (docs/limits.md): the keys with a cap or a budget, the buckets,
    #: usage per class, campaigns waiting on a limit per (class, kind)
    limit_keys: list[LimitKey] = field(default_factory=list)
    limit_buckets: list[LimitBucket] = field(default_factory=list)
    usage: list[ClassUsage] = field(default_factory=list)
    limits_waiting: dict[tuple[str, str], int] = field(default_factory=dict)
    read_s: float = 0.0


def _request_durations() -> Histogram:
    # Not registered anywhere: the scrape's collector yields its samples.
    return Histogram("ledger_http_request_duration_seconds",
                     "Time to answer a request (to its last byte; event streams excluded)",
                     ["method", "route"], buckets=REQUEST_BUCKETS, registry=None)


@dataclass
class ProcessCounters:
    """This process's own counters: requests by route template and status, and
    their durations (prometheus-client's histogram)."""

    requests: dict[tuple[str, str, str], int] = field(default_factory=dict)
    durations: Histogram = field(default_factory=_request_durations)

    def count_request(self, method: str, route: str, status: int,
                      duration_s: float | None = None) -> None:
        """Count one answered request (and how long it took, unless it streamed).

        Labels are bounded whatever clients send: a method outside HTTP's
        standard ones counts as ``other`` (h11 accepts any token as a method),
        a path no route matched as ``unmatched`` (the caller's), a status
        outside 100-599 as ``other``."""
        method = method if method in STANDARD_METHODS else "other"
        code = str(status) if 100 <= status <= 599 else "other"
        key = (method, route, code)
        self.requests[key] = self.requests.get(key, 0) + 1
        if duration_s is not None and not route.endswith("/events"):
            self.durations.labels(method, route).observe(duration_s)


async def read_snapshot(reads: Reads) -> Snapshot:
    """Read everything the metrics need, as the caller's role."""
    started = time.perf_counter()
    snapshot = Snapshot(
        states=await reads.state_counts(),
        class_states=await reads.class_state_counts(),
        oldest_ready_age_s=await reads.oldest_ready_age(),
        transitions=await reads.transition_counts(),
        attempts=await reads.attempt_outcomes(),
        verifications=await reads.verification_outcomes(),
        side_effects=await reads.side_effect_counts(),
        attempt_durations=await reads.attempt_durations(DURATION_BUCKETS),
        verification_durations=await reads.verification_durations(DURATION_BUCKETS),
        notify_queue_usage=await reads.notify_queue_usage(),
        waiting={key: count for key, (count, _) in (await reads.waiting_counts()).items()},
        sensor_outcomes=await reads.sensor_outcome_counts(),
        sensor_errors={s.sensor: s.consecutive_errors
                       for s in await reads.sensor_summaries(SENSOR_LIMIT)},
        approvals={b.class_: (b.waiting, b.oldest_age_s) for b in await reads.approval_backlog()},
        approval_decisions=await reads.approval_decisions(),
        not_ready=_by_role(await reads.processes_not_ready()),
        # only keys an operator capped or budgeted: a label's values are not a bounded set
        limit_keys=[k for k in await reads.limit_keys()
                    if k.max_leased is not None or k.max_verifying is not None
                    or k.max_cost_per_day is not None][:LIMIT_KEYS],
        limit_buckets=await reads.limit_buckets(),
        usage=await reads.usage_by_class(),
        limits_waiting={(w.class_, w.kind): w.campaigns for w in await reads.limits_waiting()},
    )
    snapshot.read_s = time.perf_counter() - started
    return snapshot


def _by_role(processes: list[ProcessRow]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for process in processes:
        counts[process.role] = counts.get(process.role, 0) + 1
    return counts


def _histogram(name: str, doc: str, rows: Buckets) -> HistogramMetricFamily:
    buckets = [("+Inf" if le == float("inf") else f"{le:g}", count) for le, count, _ in rows]
    total = rows[-1][2] if rows else 0.0
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


class LedgerCollector(Collector):
    """A custom collector over one scrape's snapshot and this process's hub."""

    def __init__(self, snapshot: Snapshot, hub: Hub | None, process: ProcessCounters):
        self.snapshot = snapshot
        self.hub = hub
        self.process = process

    def _limits(self) -> Iterator[Metric]:
        """Limits and usage (docs/limits.md)."""
        s = self.snapshot
        leased = GaugeMetricFamily("ledger_limit_leased", "Campaigns leased under each capped key",
                                   labels=["key"])
        cap = GaugeMetricFamily("ledger_limit_max_leased", "Each key's cap of leases (absent: none)",
                                labels=["key"])
        verifying = GaugeMetricFamily("ledger_limit_verifying",
                                      "Campaigns in verification under each capped key", labels=["key"])
        spent = GaugeMetricFamily("ledger_limit_cost_today", "Cost reported today (UTC) under each key",
                                  labels=["key"])
        for k in s.limit_keys:
            leased.add_metric([k.key], k.leased)
            verifying.add_metric([k.key], k.verifying)
            spent.add_metric([k.key], k.cost_today)
            if k.max_leased is not None:
                cap.add_metric([k.key], k.max_leased)
        yield from (leased, cap, verifying, spent)
        taken = CounterMetricFamily("ledger_bucket_requests", "Requests each resource's bucket gave out",
                                    labels=["resource"])
        tokens = CounterMetricFamily("ledger_bucket_tokens", "Tokens reported against each resource",
                                     labels=["resource"])
        wait = GaugeMetricFamily("ledger_bucket_wait_seconds",
                                 "How long a claim would wait on each resource now", labels=["resource"])
        for b in s.limit_buckets:
            taken.add_metric([b.resource], b.requests)
            tokens.add_metric([b.resource], b.tokens)
            wait.add_metric([b.resource], max(b.request_wait_s, b.token_wait_s))
        yield from (taken, tokens, wait)
        used = CounterMetricFamily("ledger_usage_tokens", "Tokens the attempts reported, per class",
                                   labels=["class", "direction"])
        cost = CounterMetricFamily("ledger_usage_cost", "Cost the attempts reported, per class",
                                   labels=["class"])
        for u in s.usage:
            used.add_metric([u.class_, "in"], u.tokens_in)
            used.add_metric([u.class_, "out"], u.tokens_out)
            cost.add_metric([u.class_], u.cost)
        yield from (used, cost)
        held = GaugeMetricFamily("ledger_campaigns_waiting_on_limits",
                                 "Ready campaigns held back by a limit (kind: limit, rate, budget)",
                                 labels=["class", "kind"])
        for (cls, kind), count in sorted(s.limits_waiting.items()):
            held.add_metric([cls, kind], count)
        yield held

    def collect(self) -> Iterator[Metric]:
        """Yield every metric family."""
        yield from self._campaigns()
        yield from self._approvals()
        yield from self._flow()
        yield from self._sensors()
        yield from self._durations()
        yield from self._process()

    def _campaigns(self) -> Iterator[Metric]:
        """Campaigns per class and state, and those held back."""
        s = self.snapshot
        campaigns = GaugeMetricFamily("ledger_campaigns", "Campaigns per class and state",
                                      labels=["class", "state"])
        classes = sorted({cls for cls, _ in s.class_states})
        for cls in classes:  # every state of every class with campaigns, zero included
            for state in s.states:
                campaigns.add_metric([cls, state], s.class_states.get((cls, state), 0))
        yield campaigns
        waiting = GaugeMetricFamily("ledger_campaigns_waiting",
                                    "Campaigns held back by what is not the attempt's own, per "
                                    "class and reason (system_fault: the remote, the sandbox, a "
                                    "verifier's environment; target: a dirty checkout of the "
                                    "promotion target)", labels=["class", "reason"])
        for cls in sorted(set(classes) | {c for c, _ in s.waiting}):
            for reason in WAITING_REASONS:
                waiting.add_metric([cls, reason], s.waiting.get((cls, reason), 0))
        yield waiting

    def _approvals(self) -> Iterator[Metric]:
        """Approvals waiting, their age, and the decisions made."""
        s = self.snapshot
        classes = {cls for cls, _ in s.class_states}
        approvals = GaugeMetricFamily("ledger_approvals_waiting",
                                      "Verified candidates waiting for a person's approval, per class "
                                      "(docs/approval.md)", labels=["class"])
        oldest = GaugeMetricFamily("ledger_approval_oldest_age_seconds",
                                   "How long the oldest approval of each class has waited (0: none waits)",
                                   labels=["class"])
        for cls in sorted(set(classes) | set(s.approvals)):  # every class with campaigns, zero included
            count, age = s.approvals.get(cls, (0, 0.0))
            approvals.add_metric([cls], count)
            oldest.add_metric([cls], age)
        yield approvals
        yield oldest
        decisions = CounterMetricFamily("ledger_approval_decisions",
                                        "Approvals decided, per decision and by whom (operator: a "
                                        "person; system: the class's timeout)",
                                        labels=["decision", "by"])
        for decision in ("approved", "denied", "abandoned"):  # zero included: a rate from the start
            for by in ("operator", "system"):
                decisions.add_metric([decision, by], s.approval_decisions.get((decision, by), 0))
        yield decisions
        yield from self._limits()
        yield GaugeMetricFamily("ledger_oldest_ready_age_seconds",
                                "Age of the oldest ready campaign (0: none is ready)",
                                value=s.oldest_ready_age_s or 0.0)


    def _flow(self) -> Iterator[Metric]:
        """Transitions, claims, attempts, verdicts and side effects: what flowed."""
        s = self.snapshot
        transitions = CounterMetricFamily("ledger_transitions", "State transitions made",
                                          labels=["transition"])
        for name, count in s.transitions.items():
            transitions.add_metric([name], count)
        yield transitions
        yield CounterMetricFamily("ledger_claims", "Campaigns claimed by workers",
                                  value=s.transitions.get("claim", 0))
        yield CounterMetricFamily("ledger_lease_expiries", "Leases the reaper expired",
                                  value=s.transitions.get("expire_lease", 0))

        attempts = CounterMetricFamily("ledger_attempts", "Ended attempts per outcome",
                                       labels=["outcome"])
        for outcome, count in s.attempts.items():
            if outcome != "running":  # a running attempt's outcome is yet to come
                attempts.add_metric([outcome], count)
        yield attempts
        yield GaugeMetricFamily("ledger_attempts_running", "Attempts in progress",
                                value=s.attempts.get("running", 0))

        verdicts = CounterMetricFamily("ledger_verdicts", "Verifiers' verdicts",
                                       labels=["verdict"])
        for verdict in ("accepted", "rejected"):
            verdicts.add_metric([verdict], s.verifications.get(verdict, 0))
        yield verdicts

        requested = CounterMetricFamily("ledger_side_effects", "Side-effect intents recorded",
                                        labels=["kind"])
        by_state = GaugeMetricFamily("ledger_side_effects_by_state",
                                     "Side effects per kind and current state",
                                     labels=["kind", "state"])
        per_kind: dict[str, int] = {}
        for (kind, state), count in s.side_effects.items():
            per_kind[kind] = per_kind.get(kind, 0) + count
            by_state.add_metric([kind, state], count)
        for kind, count in per_kind.items():
            requested.add_metric([kind], count)
        yield requested
        yield by_state


    def _sensors(self) -> Iterator[Metric]:
        """The sensors' observations and their errors in a row."""
        s = self.snapshot
        observations = CounterMetricFamily(
            "ledger_sensor_observations", "Observations recorded per sensor and outcome (green, "
            "red; error: the check itself failed, which opens and closes nothing)",
            labels=["sensor", "outcome"])
        sensors = sorted({name for name, _ in s.sensor_outcomes} | set(s.sensor_errors))
        for name in sensors:  # every outcome of every sensor, zero included
            for outcome in OUTCOMES:
                observations.add_metric([name, outcome], s.sensor_outcomes.get((name, outcome), 0))
        yield observations
        errors = GaugeMetricFamily(
            "ledger_sensor_consecutive_errors", "Errors a sensor recorded in a row since its "
            "latest green or red observation: its check keeps failing, so its target is not seen",
            labels=["sensor"])
        for name in sensors:
            errors.add_metric([name], s.sensor_errors.get(name, 0))
        yield errors


    def _durations(self) -> Iterator[Metric]:
        """How long attempts and verifications took."""
        s = self.snapshot
        yield _histogram("ledger_attempt_duration_seconds",
                         "Claim to end of finished attempts", s.attempt_durations)
        yield _histogram("ledger_verification_duration_seconds",
                         "Claim to verdict of finished verifications", s.verification_durations)


    def _process(self) -> Iterator[Metric]:
        """Processes not ready, the notification queue, this process's hub and requests."""
        s = self.snapshot
        not_ready = GaugeMetricFamily("ledger_processes_not_ready",
                                      "Live processes that wait to start: their host or their "
                                      "configuration is not ready for them (the registry's "
                                      "not_ready; `ledger status` says why)", labels=["role"])
        for role in ("sensor", "worker", "reaper", "verifier", "dispatcher", "operator"):
            not_ready.add_metric([role], s.not_ready.get(role, 0))
        yield not_ready
        yield GaugeMetricFamily("ledger_notify_queue_usage",
                                "Share (0..1) of the server's notification queue in use "
                                "(pg_notification_queue_usage); /readyz is degraded above 0.5",
                                value=s.notify_queue_usage)
        if self.hub is not None:
            yield CounterMetricFamily("ledger_hub_reconnects",
                                      "Times this process's LISTEN connection was re-established",
                                      value=self.hub.reconnects)
            yield GaugeMetricFamily("ledger_hub_connected",
                                    "Whether this process's LISTEN connection is up",
                                    value=1 if self.hub.connected else 0)
            yield GaugeMetricFamily("ledger_hub_deaf",
                                    "Whether this process's hub does not hear NOTIFY "
                                    "(it then polls: LISTEN through a pooler?)",
                                    value=1 if self.hub.deaf else 0)
            yield CounterMetricFamily("ledger_hub_missed_round_trips",
                                      "The hub's NOTIFY round trips to itself that did not "
                                      "come back in time", value=self.hub.misses)
            yield CounterMetricFamily("ledger_hub_dropped_notifications",
                                      "Notifications dropped from full subscriber queues",
                                      value=self.hub.dropped)
        requests = CounterMetricFamily("ledger_http_requests", "Requests this process answered",
                                       labels=["method", "route", "status"])
        for (method, route, status), count in sorted(self.process.requests.items()):
            requests.add_metric([method, route, status], count)
        yield requests
        yield from self.process.durations.collect()
        yield GaugeMetricFamily("ledger_metrics_read_seconds",
                                "Time this scrape spent reading the database", value=s.read_s)


@router.get("/metrics", response_class=Response,
            responses={200: {"description": "Prometheus text format",
                             "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}},
                       **problems.responses(401, 503)})
async def metrics(request: Request, caller: CallerDep) -> Response:
    """Prometheus metrics, read from the database now."""
    api = request.app.state.ledger
    snapshot = await read_snapshot(caller.reads)
    # A registry per scrape: the collector is bound to this scrape's snapshot.
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(snapshot, api.hub, api.counters))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
