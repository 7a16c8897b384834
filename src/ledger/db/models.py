"""Pydantic models of what the kernel returns and what the read views hold."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

#: A campaign's state, in display order. ledger.state (state_machine.sql) is
#: the source; tests/test_schema.py checks these three against it.
State = Literal["ready", "leased", "attempted", "verified", "awaiting_approval", "exhausted",
                "budget_exhausted", "confirmed", "dismissed", "abandoned"]
STATES: tuple[State, ...] = get_args(State)
TERMINAL_STATES: frozenset[str] = frozenset({"confirmed", "dismissed", "abandoned"})
OPEN_STATES: tuple[State, ...] = tuple(s for s in STATES if s not in TERMINAL_STATES)


def _as_document(value: Any) -> Any:
    # A stored document that is not an object (written by hand, or before its
    # CHECK) reads as an object holding it: no read fails on one row's value.
    return value if value is None or isinstance(value, dict) else {"value": value}


#: A JSON object column (jsonb).
Document = Annotated[dict[str, Any], BeforeValidator(_as_document)]


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)


class Campaign(_Row):
    """One open (or closed) objective: the durable row."""

    id: int
    class_: str = Field(alias="class")
    objective_key: str
    target: str
    desired_state: Document
    opening_observation: Document
    state: State
    lease_owner: str | None
    leased_at: datetime | None
    lease_expires_at: datetime | None
    generation: int
    attempt_count: int
    max_attempts: int
    next_attempt_at: datetime
    last_failure_reason: str | None
    acceptance_criteria: Document
    evidence_location: str | None
    seat: str | None
    priority: int
    labels: list[str]
    event_seq: int
    promoted_at: datetime | None
    promoted_sha: str | None
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None
    #: what holds the campaign back that is not its attempts' doing (a system
    #: fault, a condition of the target), why, and since when
    waiting_on: Literal["system_fault", "target"] | None = None
    waiting_reason: str | None = None
    waiting_since: datetime | None = None
    fault_count: int = 0
    #: the W3C trace context of the open (``traceparent``, ``tracestate``;
    #: ``None``: opened untraced), which every step's span joins (ledger.tracing)
    trace_context: dict[str, str] | None = None
    #: limits (docs/limits.md): the keys it is counted under, the rate-limited
    #: resources its attempts use, its budget (None: none) and what its
    #: attempts reported they cost
    limit_keys: list[str] = Field(default_factory=list)
    resources: list[str] = Field(default_factory=list)
    max_cost: float | None = None
    cost_spent: float = 0.0
    #: its key of the class's fair_key template (fair claims), or None
    fair_key: str | None = None
    #: what its limits hold it back by, in words ("limit repo:app 8/8"); None: nothing
    waiting_for: str | None = None

    @property
    def is_terminal(self) -> bool:
        """Whether the campaign is closed for good."""
        return self.state in TERMINAL_STATES


class Attempt(_Row):
    """One claim of a campaign and how it ended."""

    id: int
    campaign_id: int
    attempt_no: int
    generation: int
    worker: str
    claimed_at: datetime
    lease_expires_at: datetime
    last_heartbeat_at: datetime | None
    heartbeat_count: int
    outcome: Literal["running", "attempted", "failed", "lost", "drained", "released", "abandoned"]
    verdict: Literal["accepted", "rejected"] | None
    ended_at: datetime | None
    failure_reason: str | None
    fingerprint: str | None
    base_sha: str | None
    candidate_sha: str | None
    bundle: Document | None
    bundle_digest: str | None
    log_tail: str | None
    candidate_ref: str | None = None
    diff_bytes: int | None = None


class Event(_Row):
    """One journal entry; ``seq`` is the resume cursor."""

    campaign_id: int
    seq: int
    type: str
    actor: str
    generation: int
    delta: bool
    payload: Document
    created_at: datetime
    #: The role whose call wrote it (an operator's is a human's action); None
    #: for events journaled before roles were recorded, and for verifiers' and
    #: dispatchers' bookkeeping events.
    actor_role: str | None = None


class Observation(_Row):
    """A sensor's reading of a target."""

    id: int
    sensor: str
    target: str
    objective_key: str
    class_: str | None = Field(alias="class")
    #: green or red: what the target is; error: the check itself failed
    #: (the reason says how), which moves no campaign
    status: Literal["green", "red", "error"]
    started_at: datetime
    finished_at: datetime
    tick: datetime | None
    details: Document
    campaign_id: int | None
    effect: Literal["opened", "regressed", "confirmed", "dismissed", "recorded"]
    idempotency_key: str | None
    recorded_at: datetime
    #: why it had no effect it could have had: a green one that did not confirm
    #: (the opening baseline not shown passing), one of a streak still too
    #: short (open_after, confirm_after), an error (what went wrong with the check)
    reason: str | None = None


class Verification(_Row):
    """A verifier's check of one attempt."""

    id: int
    campaign_id: int
    attempt_id: int
    generation: int
    verifier: str
    model_family: str | None
    status: Literal["running", "accepted", "rejected", "lost", "released", "abandoned"]
    claimed_at: datetime
    lease_expires_at: datetime
    finished_at: datetime | None
    reason: str | None
    evidence: Document
    #: which verifier of the class's quorum this verdict is
    kind: str = "command"


class SideEffect(_Row):
    """An outbox intent and what became of it."""

    id: int
    campaign_id: int
    generation: int
    kind: Literal["git.update_ref", "http.request"]
    purpose: Literal["promotion", "other"]
    target: str
    precondition: Document
    payload: Document
    idempotency_key: str
    requested_by: str
    requested_role: str
    state: Literal["pending", "claimed", "done", "conflict", "failed", "cancelled"]
    claimed_by: str | None
    lease_expires_at: datetime | None
    tries: int
    next_try_at: datetime
    result: Document | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class SecurityEvent(_Row):
    """A refused write, kept."""

    id: int
    at: datetime
    actor_role: str
    actor: str
    campaign_id: int | None
    action: str
    target: str
    reason: str
    details: Document


class CampaignClass(_Row):
    """What the kernel knows of a campaign class."""

    name: str
    max_attempts: int
    lease_seconds: float
    backoff_base_s: float
    backoff_factor: float
    backoff_cap_s: float
    backoff_jitter: float
    seat_policy: Literal["none", "target"]
    authority: Document
    acceptance: Document
    promotion: Document
    verifier: str
    created_at: datetime
    updated_at: datetime
    #: share of claims when several classes have ready work (claim_campaign)
    weight: int = 1
    #: how often a worker renews a lease (None: not registered; a third of the lease)
    heartbeat_seconds: float | None = None
    #: when an operator paused the class (claims skip it); None: not paused
    paused_at: datetime | None = None
    #: the quorum: every one of these verifier kinds must accept, in order
    verifiers: list[str] = Field(default_factory=list)
    #: whether a person approves a verified candidate before its promotion
    #: (``{}``: never; see ``ledger.config.ApprovalPolicy``)
    approval: Document = Field(default_factory=dict)
    #: limits: key templates, resources used, each campaign's budget
    limit_keys: list[str] = Field(default_factory=list)
    resources: list[str] = Field(default_factory=list)
    max_cost: float | None = None
    #: the key template its claims are fair across (None: claim order alone)
    fair_key: str | None = None

    @property
    def heartbeat_s(self) -> float:
        """The lease renewal interval the class's workers keep."""
        return self.heartbeat_seconds or self.lease_seconds / 3


class ApprovalReason(_Row):
    """One condition of a class's approval policy that asked a person to look."""

    condition: str = Field(description="The condition's key in the policy (`always`, `diff_lines_over`, ...)")
    detail: str = Field(description="What was found")


class Approval(_Row):
    """An approval a verified candidate waits for (or got): which conditions
    asked, until when, and who decided what (``ledger_api.approvals``)."""

    id: int
    campaign_id: int
    generation: int
    attempt_id: int
    reasons: list[ApprovalReason]
    #: the promotion intent the verdicts asked for, requested once approved
    #: (None: the class promotes nothing)
    promotion: Document | None
    requested_at: datetime
    #: when the class's timeout decides (None: it waits for a person)
    deadline: datetime | None
    on_timeout: Literal["deny", "abandon", "approve"]
    decision: Literal["approved", "denied", "abandoned"] | None
    decided_by: str | None
    decided_role: Literal["operator", "system"] | None
    decided_by_transition: str | None
    decision_reason: str | None
    decided_at: datetime | None
    #: the promotion its approval requested
    side_effect_id: int | None


class WaitingApproval(Approval):
    """An approval no one has decided yet, with its campaign's class, objective and target."""

    class_: str = Field(alias="class")
    objective_key: str
    target: str


class ApprovalBacklog(_Row):
    """One class's undecided approvals: how many, and the oldest one's age."""

    class_: str = Field(alias="class")
    waiting: int
    oldest_age_s: float


class ApprovalDecision(_Row):
    """What ``approve`` or ``deny`` did."""

    approval_id: int
    decision: Literal["approved", "denied", "abandoned"]
    state: State
    generation: int
    #: the promotion requested by the approval (None: denied, or nothing to promote)
    side_effect_id: int | None


class ApprovalExpired(_Row):
    """An approval whose deadline decided (``expire_approvals``)."""

    campaign_id: int
    approval_id: int
    decision: Literal["approved", "denied", "abandoned"]
    state: State


class ClassEvent(_Row):
    """What an operator did to a class (``ledger_api.class_events``)."""

    id: int
    class_: str = Field(alias="class")
    type: Literal["class.paused", "class.resumed"]
    actor: str
    actor_role: str
    reason: str | None
    created_at: datetime


class ClassPause(_Row):
    """What ``pause_class`` / ``resume_class`` did: the class is paused since
    ``paused_at`` (None: not paused); ``changed`` is False when it already was."""

    class_: str = Field(alias="class")
    paused_at: datetime | None
    changed: bool


class ProcessRow(_Row):
    """A process of the registry (``ledger_api.processes``): who it is, what it
    holds, when it was last seen and how it reads now."""

    role: str
    host: str
    pid: int
    started_at: datetime
    identity: str
    service: str
    interval_s: float
    holds: list[dict[str, Any]]
    last_seen: datetime
    stopped_at: datetime | None
    status: Literal["live", "stopped", "gone"]
    #: why it waits to start (its host or its configuration); None: it works
    not_ready: str | None = None


class AttemptDiff(BaseModel):
    """An attempt's candidate diff as a page shows it: a bounded head, decoded."""

    campaign_id: int
    attempt_no: int
    generation: int
    candidate_ref: str | None
    bytes: int  # the whole diff's size
    text: str  # its first bytes, as text (invalid UTF-8 replaced)
    truncated: bool  # whether the diff is longer than ``text``


class ProcessReport(BaseModel):
    """What a process says of itself to the registry (``Kernel.report_*_process``)."""

    host: str
    pid: int
    started_at: datetime
    identity: str
    service: str
    interval_s: float
    holds: list[dict[str, Any]] = Field(default_factory=list)
    stopping: bool = False
    #: why it waits to start (one line: the cause and the fix); None: it works
    not_ready: str | None = None


class StateRow(_Row):
    """A state of the machine."""

    name: str
    is_terminal: bool
    position: int
    description: str


class TransitionRow(_Row):
    """A legal transition, as the database holds it."""

    name: str
    from_state: str | None
    to_state: str
    owner_role: str
    db_role: str | None
    note: str


# --- results of kernel calls ------------------------------------------------


class Opened(_Row):
    """Result of ``open_campaign``."""

    campaign_id: int
    created: bool
    state: State
    generation: int


class ObservationRecorded(_Row):
    """Result of ``record_observation``."""

    observation_id: int
    campaign_id: int | None
    effect: Literal["opened", "regressed", "confirmed", "dismissed", "recorded"]
    duplicate: bool
    #: why it had no effect it could have had (see ``Observation.reason``)
    reason: str | None = None


class SensorSummary(_Row):
    """A sensor as ``ledger status``, the dashboard and ``GET /sensors`` show it:
    its latest observation and tick, and how it is failing, if it is."""

    sensor: str
    #: the latest observation (None: it has claimed ticks but recorded nothing)
    observation_id: int | None = None
    target: str | None = None
    objective_key: str | None = None
    #: the latest outcome: green, red or error
    status: Literal["green", "red", "error"] | None = None
    effect: Literal["opened", "regressed", "confirmed", "dismissed", "recorded"] | None = None
    campaign_id: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    recorded_at: datetime | None = None
    last_tick: datetime | None = None
    tick_claimed_by: str | None = None
    tick_claimed_at: datetime | None = None
    #: errors recorded in a row since its latest green or red observation
    #: (counted up to 10000): the check itself keeps failing
    consecutive_errors: int = 0
    #: its latest error's reason, start and id, however long ago
    last_error: str | None = None
    last_error_at: datetime | None = None
    last_error_id: int | None = None


class Reobserved(_Row):
    """Result of ``reobserve``: the worker's own observation of its target."""

    observation_id: int
    #: dismissed (it was green: the campaign is closed, nothing charged) or recorded
    effect: Literal["dismissed", "recorded"]
    #: why the campaign was dismissed, or what went wrong with the check
    reason: str | None = None


class Claim(_Row):
    """A lease on a campaign: what the worker needs for one attempt."""

    campaign_id: int
    generation: int
    attempt_no: int
    lease_expires_at: datetime
    class_: str = Field(alias="class")
    objective_key: str
    target: str
    desired_state: Document
    opening_observation: Document
    acceptance_criteria: Document
    attempt_count: int
    max_attempts: int
    #: the lease's length by the database's clock when it was granted
    lease_remaining_s: float


class Lease(_Row):
    """A renewed lease: its expiry and how long that was from the renewal,
    both by the database's clock (see ``ledger.roles.lease``)."""

    lease_expires_at: datetime
    lease_remaining_s: float


class AttemptRecord(BaseModel):
    """One candidate for ``Kernel.record_attempts``."""

    campaign_id: int
    generation: int
    candidate_sha: str
    fingerprint: str
    base_sha: str | None = None
    bundle: Document | None = None
    bundle_digest: str | None = None
    evidence_location: str | None = None
    log_tail: str | None = None
    #: the candidate's diff, base64 (JSON carries no bytes)
    diff: str | None = None
    candidate_ref: str | None = None


class AttemptRecorded(_Row):
    """What became of one item of a batch record: ``recorded`` or ``stale``."""

    campaign_id: int
    generation: int
    status: Literal["recorded", "stale"]
    attempt_no: int | None


class Reaped(_Row):
    """A lease the reaper returned to ready (or exhausted)."""

    campaign_id: int
    generation: int
    worker: str
    state: State


class VerificationClaim(_Row):
    """A verifier's claim of an attempted campaign."""

    verification_id: int
    campaign_id: int
    generation: int
    attempt_id: int
    attempt_no: int
    class_: str = Field(alias="class")
    objective_key: str
    target: str
    base_sha: str | None
    candidate_sha: str | None
    fingerprint: str | None
    bundle: Document | None
    bundle_digest: str | None
    acceptance_criteria: Document
    evidence_location: str | None
    worker: str
    lease_expires_at: datetime
    #: the verification lease's length by the database's clock
    lease_remaining_s: float
    #: the candidate's evidence, from the database: its diff and published ref
    diff: bytes | None = None
    candidate_ref: str | None = None
    #: the verifier kind this verification is for, and the class's whole quorum
    kind: str = "command"
    quorum: list[str] = Field(default_factory=lambda: ["command"])


class SideEffectRequested(_Row):
    """Result of ``request_side_effect`` (a refusal raises ``Forbidden``)."""

    side_effect_id: int
    status: Literal["requested", "existing"]
    state: str


class SideEffectClaim(_Row):
    """A dispatcher's claim of an intent."""

    side_effect_id: int
    claim_token: int
    campaign_id: int
    generation: int
    kind: Literal["git.update_ref", "http.request"]
    purpose: Literal["promotion", "other"]
    target: str
    precondition: Document
    payload: Document
    idempotency_key: str
    tries: int
    lease_expires_at: datetime
    #: the claim's lease length by the database's clock
    lease_remaining_s: float


class CampaignDetail(_Row):
    """A campaign with everything that happened to it."""

    campaign: Campaign
    attempts: list[Attempt]
    verifications: list[Verification]
    side_effects: list[SideEffect]
    observations: list[Observation]
    #: approvals asked for (oldest first), and how each was decided
    approvals: list[Approval] = Field(default_factory=list)


class HourActivity(BaseModel):
    """One hour of the ledger's throughput and latency (``Reads.activity``)."""

    hour: datetime
    opened: int
    closed: int
    claims: int
    wait_p50: float | None  # seconds from ready to claimed
    wait_p95: float | None
    attempts_ended: int
    duration_p50: float | None  # seconds from claim to end of an attempt
    duration_p95: float | None
    accepted: int
    rejected: int


class ClassSummary(BaseModel):
    """One class at a glance (``Reads.class_summary``)."""

    name: str
    states: dict[str, int]
    confirmed: int  # in the window
    confirm_p50_s: float | None  # open to confirm, seconds
    confirm_p95_s: float | None
    oldest_ready_age_s: float | None
    days: int


class LimitKey(_Row):
    """One limit key: its caps, its use and today's spend (``ledger_api.limit_keys``)."""

    key: str
    max_leased: int | None
    max_verifying: int | None
    max_cost_per_day: float | None
    weight: int
    leased: int
    verifying: int
    cost_today: float
    cost_total: float
    updated_at: datetime
    updated_by: str | None


class LimitBucket(_Row):
    """One rate-limited resource (``ledger_api.limit_buckets``): its rates,
    what it gave out, and how long a claim would wait on it now."""

    resource: str
    requests_per_minute: float | None
    tokens_per_minute: float | None
    requests: int
    tokens: int
    request_wait_s: float
    token_wait_s: float
    updated_at: datetime
    updated_by: str | None


class AttemptUsage(_Row):
    """What one attempt reported it used (``ledger_api.attempt_usage``)."""

    campaign_id: int
    generation: int
    attempt_no: int
    class_: str = Field(alias="class")
    tokens_in: int
    tokens_out: int
    requests: int
    cost: float
    reports: int
    first_at: datetime
    last_at: datetime


class LimitEvent(_Row):
    """A change of the limits, journaled (``ledger_api.limit_events``)."""

    id: int
    at: datetime
    type: str
    subject: str
    actor: str
    actor_role: str
    detail: Document


class UsageResult(_Row):
    """What ``report_usage`` says: the campaign's spend against its budget."""

    cost_spent: float
    max_cost: float | None
    over_budget: bool


class ClassUsage(_Row):
    """Usage reported by one class's attempts (``Reads.usage_by_class``)."""

    class_: str = Field(alias="class")
    tokens_in: int
    tokens_out: int
    requests: int
    cost: float
    cost_today: float
    attempts: int


class LimitWaiting(_Row):
    """How many ready campaigns of a class wait on one kind of limit
    (``limit``, ``rate``, ``budget``)."""

    class_: str = Field(alias="class")
    kind: str
    campaigns: int
    #: one of their reasons, in words ("limit repo:app 8/8")
    example: str
