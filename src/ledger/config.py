"""``ledger.toml``: campaign classes (and sensors), validated with clear errors.

A class says how a worker attempts a campaign (repository, base ref, attempt
command, timeouts, backoff, lease and heartbeat), how a verifier judges it
(acceptance commands, verifier kind) and what each role may touch (authority
profile). The parts the kernel must judge (attempt budget, lease, backoff,
authority, promotion target) are registered in the database by
``ledger classes sync``; the rest stays in the file the runtimes read.

Example::

    [classes.fix-tests]
    repository = "/srv/repos/app"
    base_ref = "main"
    attempt_command = ["my-agent", "fix", "--objective-file", "{campaign_file}"]
    attempt_timeout_s = 900
    max_attempts = 3
    lease_s = 60
    heartbeat_s = 10
    backoff = { base_s = 30, factor = 2, cap_s = 1800, jitter = 0.2 }
    seat = "target"
    acceptance = { commands = [["python", "-m", "pytest", "-q"]], timeout_s = 600 }
    verifier = "pytest"
    promote_to = "refs/heads/main"
    authority.worker = { refs = ["refs/heads/ledger/*"] }
    authority.dispatcher = { refs = ["refs/heads/main"] }
    attempt_environment = ["ANTHROPIC_API_KEY"]   # passed to the attempt command only
    committer = "Ledger <ledger@example.org>"
    approval = { when = [{ diff_lines_over = 400 }, { paths = ["migrations/*"] }] }  # docs/approval.md
    approval_timeout_s = 86400
    approval_notify = "https://chat.example.org/hooks/xyz"

``acceptance.protected`` (default: derived from the commands, see
``ledger.git.protection``), ``acceptance.allow_protected_changes`` and
``acceptance.environment`` (the verifier's extras) travel with the acceptance
spec: the kernel stores it with each campaign, and the verifier reads it from
there, never from what the worker wrote.
"""

from __future__ import annotations

import re
import string
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ledger.errors import ConfigError
from ledger.git.repository import Identity
from ledger.sandbox.cell import CellPolicy
from ledger.sandbox.processes import check_extra

# The acceptance spec is one model, the judge's: ledger.toml writes it, rows store it.
from ledger.verifiers.spec import AcceptanceSpec
from ledger.verifiers.spec import HeldOut as HeldOut
from ledger.verifiers.spec import PytestJudge as PytestJudge
from ledger.verifiers.spec import Review as Review
from ledger.verifiers.spec import ScreenRule as ScreenRule
from ledger.verifiers.spec import ScreenSettings as ScreenSettings

Acceptance = AcceptanceSpec

NAME = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
#: How long attempt branches of a closed campaign are kept by default (7 days).
BRANCH_RETENTION_S = 7 * 24 * 3600.0


def _extras(value: list[str]) -> list[str]:
    for extra in value:
        check_extra(extra)
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Backoff(_Strict):
    """Delay before retrying after the n-th failure: base * factor^(n-1), capped, +/- jitter."""

    base_s: float = Field(5.0, ge=0, description="seconds before the first retry")
    factor: float = Field(2.0, ge=1, description="each later wait is this many times longer")
    cap_s: float = Field(600.0, ge=0, description="the longest wait, in seconds")
    jitter: float = Field(0.1, ge=0, le=1, description="+/- this fraction, at random")


class RoleAuthority(_Strict):
    """What one role may touch: git refs and HTTP hosts (glob patterns, '*' = anything)."""

    refs: list[str] = Field(default_factory=list, description="git refs it may update")
    hosts: list[str] = Field(default_factory=list, description="HTTP hosts it may call")


#: What an attempt command's arguments may name (``{campaign_file}`` ...).
ATTEMPT_PLACEHOLDERS = frozenset({"campaign_file", "worktree", "campaign_id", "attempt_no"})
#: What a sensor's objective template may name.
OBJECTIVE_PLACEHOLDERS = frozenset({"sensor", "target"})


def check_placeholders(template: str, allowed: frozenset[str], where: str) -> str:
    """``ValueError`` naming ``where`` unless every ``{name}`` in
    ``template`` is one of ``allowed`` (``{{`` and ``}}`` are literal braces)."""
    try:
        fields = [f for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ValueError(f"{where}: {template!r} is not a valid template ({exc}); write a literal "
                         "brace as {{ or }}") from None
    for name in fields:
        if name not in allowed:
            raise ValueError(f"{where}: unknown placeholder {{{name}}} in {template!r} (known: "
                             + ", ".join("{" + a + "}" for a in sorted(allowed)) + ")")
    return template


class MergeQueuePolicy(_Strict):
    """How a class's verified candidates wait for their promotion target
    (``[classes.X.merge_queue]``; see docs/merge-queue.md)."""

    batch_size: int = Field(8, ge=1, le=64, description=(
        "most candidates stacked onto a moved target and verified as one batch"))
    max_wait_s: float = Field(0.0, ge=0, le=3600, description=(
        "how long the queue's head may wait for a fuller batch before a shorter one is stacked"))


#: The approval conditions that take no value: written as a bare string.
APPROVAL_FLAGS = ("protected_paths", "quorum_split")


class ApprovalCondition(_Strict):
    """One condition of ``approval = { when = [...] }``: a bare
    ``"protected_paths"`` or ``"quorum_split"``, or a table of one key."""

    protected_paths: bool | None = Field(None, description=(
        "the candidate changes protected paths (a class with acceptance.allow_protected_changes)"))
    quorum_split: bool | None = Field(None, description=(
        "a verifier of the quorum accepted but asks for a person (a review's needs_human)"))
    diff_lines_over: int | None = Field(None, ge=0, le=10**9, description=(
        "its diff adds and removes more than this many lines"))
    paths: list[str] | None = Field(None, min_length=1, max_length=100, description=(
        "it touches one of these paths (globs: * is any run of characters, / included)"))
    attempts_over: int | None = Field(None, ge=0, le=1000, description=(
        "the campaign spent more than this many attempts of its budget"))
    first_promotions: int | None = Field(None, ge=1, le=10**9, description=(
        "fewer than this many campaigns of the class were promoted before"))
    targets: list[str] | None = Field(None, min_length=1, max_length=100, description=(
        "it promotes onto one of these refs (globs)"))

    @model_validator(mode="before")
    @classmethod
    def _bare(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value not in APPROVAL_FLAGS:
                raise ValueError(f"{value!r} is not a condition without a value (those are "
                                 f"{', '.join(APPROVAL_FLAGS)}); the others are tables such as "
                                 "{ diff_lines_over = 400 }")
            return {value: True}
        return value

    @model_validator(mode="after")
    def _one(self) -> ApprovalCondition:
        given = self.model_dump(exclude_none=True)
        if len(given) != 1:
            raise ValueError("each approval condition names exactly one of "
                             + ", ".join(ApprovalCondition.model_fields))
        if given.get("protected_paths") is False or given.get("quorum_split") is False:
            raise ValueError("leave a condition out rather than set it to false")
        for globs in (self.paths or []), (self.targets or []):
            if any(not g or len(g) > 500 for g in globs):
                raise ValueError("a glob is 1 to 500 characters")
        return self

    def stored(self) -> dict[str, Any]:
        """The condition as the database keeps it (one key)."""
        return self.model_dump(exclude_none=True)


class ApprovalWhen(_Strict):
    """``approval = { when = [...] }``: a person approves when any condition holds."""

    when: list[ApprovalCondition] = Field(min_length=1, max_length=32)


#: A limit key: KIND:VALUE (``repo:app``, ``tenant:acme``).
LIMIT_KEY = r"^[a-z][a-z0-9_.-]{0,31}:[^\s]{1,200}$"
#: A class's key template: ``class``, ``repo``, a label's name (``tenant``) or a key.
LIMIT_TEMPLATE = r"^[a-z][a-z0-9_.-]{0,31}(:[^\s]{1,200})?$"


class KeyLimits(_Strict):
    """``[keys."KIND:VALUE"]``: the caps of one limit key, across every class
    whose campaigns are counted under it (docs/limits.md)."""

    max_leased: int | None = Field(None, ge=0, le=1_000_000, description=(
        "campaigns under this key leased at once (an agent running); unset: no cap"))
    max_verifying: int | None = Field(None, ge=0, le=1_000_000, description=(
        "campaigns under this key in verification at once; unset: no cap"))
    max_cost_per_day: float | None = Field(None, ge=0, le=1e9, description=(
        "spend reported under this key per UTC day; once reached its campaigns wait for the next day"))
    weight: int = Field(1, ge=1, le=1000, description=(
        "this key's share of claims among the keys of one class (fair claims)"))


class ResourceLimits(_Strict):
    """``[limits.RESOURCE]``: a named resource's rates (a model provider),
    shared by every class that says it uses it (``uses``)."""

    requests_per_minute: float | None = Field(None, gt=0, le=1_000_000, description=(
        "attempts started per minute (each claim takes one request); unset: not limited"))
    tokens_per_minute: float | None = Field(None, ge=1, le=1e10, description=(
        "tokens reported per minute (in + out); a claim waits while the reported tokens are ahead "
        "of this rate; unset: not limited"))


class CampaignClassConfig(_Strict):
    """One campaign class."""

    name: str = Field(pattern=NAME)
    repository: str = Field(min_length=1, description="local path or URL of the git repository")
    base_ref: str = Field("main", description="the ref each attempt starts from")
    attempt_command: list[str] = Field(min_length=1, description=(
        "argv of the agent or script that attempts a campaign (see the attempt protocol)"))
    attempt_timeout_s: float = Field(600.0, gt=0, description="seconds an attempt may run")
    max_attempts: int = Field(3, ge=1, le=1000,
                              description="attempts before the campaign is exhausted")
    backoff: Backoff = Field(default_factory=Backoff, description="the wait after a failure")
    lease_s: float = Field(60.0, gt=0, description="how long a claim holds without a heartbeat")
    heartbeat_s: float = Field(10.0, gt=0, description="how often a worker renews its lease")
    seat: Literal["none", "target"] = Field(
        "none", description="target: one attempt at a time per target, across campaigns")
    weight: int = Field(1, ge=1, le=1000,
                        description="share of claims when several classes have ready work")
    acceptance: Acceptance = Field(default_factory=Acceptance,
                                   description="what the verifier runs on the candidate")
    verifier: str = Field("command", pattern=r"^[a-z][a-z0-9_]*$",
                          description="verifier kind: command, pytest, review (entry points)")
    verifiers: list[str] | None = Field(
        None, min_length=1, max_length=8,
        description="a quorum: every one of these kinds must accept, in this order (default: [verifier])")
    promote_to: str | None = Field(None, description="ref a verified candidate is promoted onto")
    merge_queue: MergeQueuePolicy = Field(default_factory=MergeQueuePolicy,
                                          description="the queue promotions onto promote_to wait in")
    authority: dict[Literal["worker", "dispatcher"], RoleAuthority] = Field(
        default_factory=dict, description="what each role may touch")
    log_limit_bytes: int = Field(256 * 1024, ge=1024, description="output kept per attempt")
    attempt_environment: list[str] = Field(
        default_factory=list, description="extra variables for the attempt command: NAME or NAME=VALUE")
    author: str = Field(str(Identity()), description="author of candidate commits: Name <email>")
    committer: str = Field(str(Identity()), description="committer of promoted commits: Name <email>")
    branch_retention_s: float = Field(BRANCH_RETENTION_S, ge=0,
                                      description="keep attempt branches this long after closing")
    cell: CellPolicy = Field(default_factory=CellPolicy,
                             description="the sandbox the attempt command runs in")
    max_candidate_mb: int = Field(64, ge=1, le=64,
                                  description="largest candidate (its commits, and its diff) recorded")
    reobserve_after_s: float = Field(
        600.0, ge=0, le=31_536_000,
        description="a campaign whose opening observation is older than this is re-observed (its "
                    "sensor run once, in a cell) before an agent starts on it: green dismisses it, "
                    "nothing charged (0: before every start)")
    reobserve_before_start: bool = Field(
        True, description="re-observe an old campaign's target before starting an agent on it "
                          "(false: only before charging an attempt that changed nothing)")
    approval: Literal["never", "always"] | ApprovalWhen = Field("never", description=(
        "whether a person approves a verified candidate before it is promoted: never, always, "
        "or { when = [conditions] } (docs/approval.md)"))
    approval_timeout_s: float | None = Field(None, ge=1, le=31536000, description=(
        "how long a candidate waits for a decision before approval_on_timeout decides (unset: "
        "however long it takes)"))
    approval_on_timeout: Literal["deny", "abandon", "approve"] = Field("deny", description=(
        "what the timeout decides: deny (back to ready), abandon, or approve (only when the class "
        "says so here)"))
    approval_notify: str | None = Field(None, max_length=2000, pattern=r"^https?://[^/?#\s]+([/?#]\S*)?$",
                                        description=(
        "a URL a notice is POSTed to for each candidate that starts waiting (a chat webhook; sent "
        "by the dispatcher with an Idempotency-Key)"))

    limit_keys: list[str] = Field(default_factory=list, max_length=16, description=(
        "the keys its campaigns are counted under for caps and budgets: class (class:NAME), repo "
        "(repo:NAME of the target), a label's name such as tenant (each label tenant:VALUE the "
        "campaign was opened with), or a key such as team:infra (docs/limits.md)"))
    uses: list[str] = Field(default_factory=list, max_length=8, description=(
        "the rate-limited resources its attempts use ([limits.RESOURCE]): a claim waits until each "
        "has room"))
    max_cost: float | None = Field(None, gt=0, le=1e9, description=(
        "each campaign's budget, in the currency unit its agents report: once its attempts reported "
        "this much it is not started again (budget_exhausted) until an operator raises it"))
    max_cost_per_day: float | None = Field(None, ge=0, le=1e9, description=(
        "the class's spend per UTC day (the key class:NAME): once reached its campaigns wait for the "
        "next day"))
    fair_key: str | None = Field(None, pattern=r"^[a-z][a-z0-9_.-]{0,31}$", description=(
        "the key template its claims are fair across, such as tenant: the key with the fewest leases "
        "for its weight ([keys.KEY] weight) is claimed from first, so a tenant with a long backlog "
        "cannot hold up another's first campaign by more than one claim round"))
    max_leased: int | None = Field(None, ge=0, le=1_000_000, description=(
        "the class's campaigns leased at once (the key class:NAME)"))
    max_verifying: int | None = Field(None, ge=0, le=1_000_000, description=(
        "the class's campaigns in verification at once (the key class:NAME)"))

    _attempt_environment = field_validator("attempt_environment")(_extras)

    @field_validator("limit_keys")
    @classmethod
    def _limit_keys(cls, value: list[str]) -> list[str]:
        for template in value:
            if not re.fullmatch(LIMIT_TEMPLATE, template):
                raise ValueError(f"limit_keys: {template!r} is not class, repo, a label name such as "
                                 "tenant, or a key such as team:infra")
        return value

    @field_validator("uses")
    @classmethod
    def _uses(cls, value: list[str]) -> list[str]:
        for resource in value:
            if not re.fullmatch(NAME, resource):
                raise ValueError(f"uses: {resource!r} is not a resource name (like a class name)")
        return value

    def limit_templates(self) -> list[str]:
        """The key templates as the database keeps them (``class`` added when
        the class has caps or a day budget of its own)."""
        templates = list(dict.fromkeys(self.limit_keys))
        if (self.max_leased is not None or self.max_verifying is not None
                or self.max_cost_per_day is not None) and "class" not in templates:
            templates.append("class")
        return templates

    def class_key(self) -> KeyLimits | None:
        """The caps of the key ``class:NAME``, if the class sets any."""
        if self.max_leased is None and self.max_verifying is None and self.max_cost_per_day is None:
            return None
        return KeyLimits(max_leased=self.max_leased, max_verifying=self.max_verifying,
                         max_cost_per_day=self.max_cost_per_day)

    @field_validator("approval", mode="before")
    @classmethod
    def _approval(cls, value: Any) -> Any:
        # one message for each wrong shape, rather than the union's first
        if isinstance(value, str) and value not in ("never", "always"):
            raise ValueError(f"approval is \"never\", \"always\" or {{ when = [conditions] }}, not {value!r}")
        if isinstance(value, dict):
            try:
                return ApprovalWhen.model_validate(value)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise ValueError(f"{where}: {first['msg']}") from None
        return value

    @field_validator("attempt_command")
    @classmethod
    def _placeholders(cls, value: list[str]) -> list[str]:
        for arg in value:
            check_placeholders(arg, ATTEMPT_PLACEHOLDERS, "attempt_command")
        return value

    @field_validator("author", "committer")
    @classmethod
    def _identity(cls, value: str) -> str:
        Identity.parse(value)
        return value

    @model_validator(mode="after")
    def _heartbeat_within_lease(self) -> CampaignClassConfig:
        if self.heartbeat_s >= self.lease_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s}) must be shorter than lease_s "
                             f"({self.lease_s}), or every lease lapses between heartbeats")
        if self.promote_to and not self.promote_to.startswith("refs/"):
            raise ValueError("promote_to must be a full ref name such as refs/heads/main")
        if self.verifiers is not None:
            if len(set(self.verifiers)) != len(self.verifiers) or not all(
                    re.fullmatch(r"[a-z][a-z0-9_]*", v) for v in self.verifiers):
                raise ValueError("verifiers must be distinct verifier kinds")
            if "verifier" in self.model_fields_set and self.verifier != self.verifiers[0]:
                raise ValueError("verifier and verifiers disagree: give verifiers alone (its first "
                                 "is the class's verifier)")
        if "review" in self.quorum() and self.acceptance.review is None:
            raise ValueError("the review verifier needs acceptance.review (its command)")
        held = self.acceptance.held_out
        if held is not None and not held.commands and "pytest" not in self.quorum():
            raise ValueError("acceptance.held_out needs commands unless the pytest verifier runs them")
        if isinstance(self.approval, ApprovalWhen):
            keys = {key for condition in self.approval.when for key in condition.stored()}
            if "protected_paths" in keys and not self.acceptance.allow_protected_changes:
                raise ValueError("approval: protected_paths asks a person about candidates that change "
                                 "protected paths, which this class refuses outright: set "
                                 "acceptance.allow_protected_changes = true, or drop the condition")
        if self.approval == "never" and {"approval_timeout_s", "approval_on_timeout",
                                         "approval_notify"} & self.model_fields_set:
            raise ValueError("approval_timeout_s, approval_on_timeout and approval_notify go with "
                             "approval = \"always\" or { when = [...] }")
        return self

    def approval_policy(self) -> dict[str, Any]:
        """The approval policy as the database keeps it (``ledger.check_approval_policy``)."""
        if self.approval == "never":
            return {}
        policy: dict[str, Any] = ({"mode": "always"} if self.approval == "always" else
                                  {"mode": "when", "when": [c.stored() for c in self.approval.when]})
        if self.approval_timeout_s is not None:
            policy["timeout_s"] = self.approval_timeout_s
        policy["on_timeout"] = self.approval_on_timeout
        if self.approval_notify:
            policy["notify"] = {"url": self.approval_notify}
        return policy

    def quorum(self) -> list[str]:
        """The verifier kinds that must all accept, in order."""
        return list(self.verifiers) if self.verifiers else [self.verifier]

    def repository_names(self) -> set[str]:
        """How a sensor's target may name this class's repository: its location
        (as written or resolved) or its name (the last path component without
        ``.git``)."""
        location = self.repository.rstrip("/")
        names = {self.repository, location, _repository_name(location)}
        if "://" not in location and not location.startswith("git@"):
            names.add(str(Path(location).expanduser().resolve()))
        return names

    def refs(self) -> set[str]:
        """The refs a sensor's target may name: the base ref and the promotion target."""
        short = {r.removeprefix("refs/heads/") for r in (self.base_ref, self.promote_to) if r}
        return short | {f"refs/heads/{r}" for r in short}

    def target_problem(self, target: str) -> str | None:
        """Why a sensor's ``target`` (``REPOSITORY`` or ``REPOSITORY#REF``) is
        not in this class's repository, or ``None`` if it is."""
        named, sep, ref = target.partition("#")
        candidates = {named, named.rstrip("/")}
        if "/" in named and "://" not in named:
            candidates.add(str(Path(named).expanduser().resolve()))
        if not candidates & self.repository_names():
            return (f"target {target!r} is not in the repository of class {self.name} "
                    f"({self.repository}); name it {_repository_name(self.repository.rstrip('/'))}"
                    f"#{self.base_ref} or by its path")
        if sep and ref not in self.refs():
            return (f"target {target!r} names ref {ref!r}, but class {self.name} attempts on "
                    f"{self.base_ref}" + (f" and promotes to {self.promote_to}" if self.promote_to else ""))
        return None

    def registration(self) -> dict[str, Any]:
        """Keyword arguments for ``Kernel.register_class``: what the kernel judges."""
        authority = {role: profile.model_dump() for role, profile in self.authority.items()}
        committer = Identity.parse(self.committer)
        promotion = ({"ref": self.promote_to, "repository": self.repository,
                      "committer": {"name": committer.name, "email": committer.email},
                      "merge_queue": self.merge_queue.model_dump()}
                     if self.promote_to else {})
        if self.promote_to:
            # The dispatcher may always move the class's own promotion target.
            dispatcher = authority.setdefault("dispatcher", {"refs": [], "hosts": []})
            if not any(_glob_match(p, self.promote_to) for p in dispatcher["refs"]):
                dispatcher["refs"] = [*dispatcher["refs"], self.promote_to]
        return {
            "max_attempts": self.max_attempts,
            "lease_seconds": self.lease_s,
            "backoff_base_s": self.backoff.base_s,
            "backoff_factor": self.backoff.factor,
            "backoff_cap_s": self.backoff.cap_s,
            "backoff_jitter": self.backoff.jitter,
            "seat_policy": self.seat,
            "authority": authority,
            "acceptance": self.acceptance.effective(),
            "promotion": promotion,
            "verifier": self.quorum()[0],
            "verifiers": self.quorum(),
            "weight": self.weight,
            "heartbeat_seconds": self.heartbeat_s,
            "approval": self.approval_policy(),
        }


def _repository_name(location: str) -> str:
    tail = re.split(r"[/:]", location)[-1]
    return tail[:-4] if tail.endswith(".git") else tail


def _glob_match(pattern: str, value: str) -> bool:
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), value) is not None


class SensorConfig(_Strict):
    """A scheduled observation of a target (see ``ledger.roles.sensors``)."""

    name: str = Field(pattern=NAME)
    target: str = Field(min_length=1, description="what it watches: REPOSITORY or REPOSITORY#REF")
    every_s: float | None = Field(None, gt=0, description="interval schedule")
    cron: str | None = Field(None, description="cron schedule (5 fields)")
    command: list[str] | None = Field(None, min_length=1,
                                      description="a check command: exit 0 is green, red_exit_codes "
                                                  "red, any other ending an error")
    red_exit_codes: list[int] = Field(
        [1], min_length=1, max_length=64,
        description="the command's exit codes that mean red (the target is broken); any other "
                    "non-zero exit, a timeout, a kill, a cell that cannot be built is an error "
                    "(the check's own failure), which opens and closes nothing")
    url: str | None = Field(None, description="a check URL: expect_status is green")
    expect_status: int = Field(200, ge=100, le=599, description="the HTTP status that is green")
    red_statuses: list[int] | None = Field(
        None, max_length=100,
        description="the HTTP statuses that mean red (default: any but expect_status below 500); "
                    "any other status, a connection failure or a timeout is an error")
    open_after: int = Field(1, ge=1, le=100,
                            description="red observations in a row before one opens a campaign "
                                        "(or regresses a promoted one)")
    confirm_after: int = Field(1, ge=1, le=100,
                               description="green observations in a row before one confirms a "
                                           "promoted campaign (or dismisses an open one)")
    timeout_s: float = Field(300.0, gt=0, description="seconds a check may take")
    cwd: str | None = Field(None, description="the check command's working directory")
    objective: str = Field("{sensor}:{target}", description="objective key template")
    campaign_class: str = Field(pattern=NAME, alias="class",
                                description="the class of the campaign it opens")
    environment: list[str] = Field(default_factory=list,
                                   description="extra variables for the command: NAME or NAME=VALUE")
    cell: CellPolicy = Field(default_factory=CellPolicy,
                             description="the sandbox the check command runs in")
    checkout: bool | None = Field(None, description="run the command in an export of the target's "
                                                    "ref (default: when the target names the class's "
                                                    "repository)")

    _environment = field_validator("environment")(_extras)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("objective")
    @classmethod
    def _objective_placeholders(cls, value: str) -> str:
        return check_placeholders(value, OBJECTIVE_PLACEHOLDERS, "objective")

    @model_validator(mode="after")
    def _one_schedule_one_check(self) -> SensorConfig:
        if (self.every_s is None) == (self.cron is None):
            raise ValueError("give exactly one of every_s or cron")
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one check: command or url")
        if any(not 1 <= code <= 255 for code in self.red_exit_codes):
            raise ValueError("red_exit_codes are exit codes from 1 to 255 (0 is green)")
        if self.red_statuses is not None:
            if self.url is None:
                raise ValueError("red_statuses are for a url check; a command check has red_exit_codes")
            if any(not 100 <= code <= 599 for code in self.red_statuses):
                raise ValueError("red_statuses are HTTP statuses from 100 to 599")
            if self.expect_status in self.red_statuses:
                raise ValueError(f"expect_status {self.expect_status} is green: it cannot be red too")
        if "red_exit_codes" in self.model_fields_set and self.command is None:
            raise ValueError("red_exit_codes are for a command check; a url check has red_statuses")
        if self.cwd is not None and self.cell.sandbox:
            raise ValueError("cwd: a sandboxed check runs in an export of its target's ref (or an "
                             "empty directory), never in a directory of the host; remove cwd, or "
                             "opt out with cell.sandbox = false")
        return self

    def objective_key(self) -> str:
        """The objective key this sensor watches."""
        return self.objective.format(sensor=self.name, target=self.target)


class LedgerConfig(_Strict):
    """The whole file."""

    classes: dict[str, CampaignClassConfig] = Field(default_factory=dict)
    sensors: dict[str, SensorConfig] = Field(default_factory=dict)
    #: ``[limits.RESOURCE]``: rate-limited resources
    limits: dict[str, ResourceLimits] = Field(default_factory=dict)
    #: ``[keys."KIND:VALUE"]``: caps and budgets of limit keys
    keys: dict[str, KeyLimits] = Field(default_factory=dict)

    def key_limits(self) -> dict[str, KeyLimits]:
        """Every key's caps: the ``[keys]`` tables and the classes' own
        (``class:NAME``; a ``[keys."class:NAME"]`` table wins)."""
        found = {f"class:{name}": key for name, cls in self.classes.items()
                 if (key := cls.class_key()) is not None}
        return {**found, **self.keys}

    async def sync_limits(self, kernel: Any, operator: str | None = None) -> None:
        """Set every bucket, key and class's limits (after the classes are
        registered): ``ledger classes sync``."""
        for resource, rates in sorted(self.limits.items()):
            await kernel.set_bucket(resource, requests_per_minute=rates.requests_per_minute,
                                    tokens_per_minute=rates.tokens_per_minute, operator=operator)
        for key, caps in sorted(self.key_limits().items()):
            await kernel.set_limit(key, max_leased=caps.max_leased, max_verifying=caps.max_verifying,
                                   max_cost_per_day=caps.max_cost_per_day, weight=caps.weight,
                                   operator=operator)
        for name, cls in sorted(self.classes.items()):
            await kernel.set_class_limits(name, limit_keys=cls.limit_templates(), resources=cls.uses,
                                          max_cost=cls.max_cost, fair_key=cls.fair_key, operator=operator)

    def campaign_class(self, name: str) -> CampaignClassConfig:
        """A class by name, or ``ConfigError``."""
        try:
            return self.classes[name]
        except KeyError:
            known = ", ".join(sorted(self.classes)) or "none"
            raise ConfigError(f"campaign class {name!r} is not in the config (known: {known})") from None


def parse_config(data: dict[str, Any], source: str = "config") -> LedgerConfig:
    """Validate a config mapping; names come from the table keys."""
    try:
        raw_classes = data.get("classes", {})
        raw_sensors = data.get("sensors", {})
        if not isinstance(raw_classes, dict) or not isinstance(raw_sensors, dict):
            raise ConfigError(f"{source}: [classes] and [sensors] must be tables")
        unknown = set(data) - {"classes", "sensors", "limits", "keys"}
        raw_limits = data.get("limits", {})
        raw_keys = data.get("keys", {})
        if not isinstance(raw_limits, dict) or not isinstance(raw_keys, dict):
            raise ConfigError(f"{source}: [limits] and [keys] must be tables")
        if unknown:
            raise ConfigError(f"{source}: unknown top-level keys: {', '.join(sorted(unknown))}")
        where_prefix = ""
        classes = {}
        for name, body in raw_classes.items():
            where_prefix = f"classes.{name}."
            classes[name] = CampaignClassConfig(name=name, **body)
        sensors = {}
        for name, body in raw_sensors.items():
            where_prefix = f"sensors.{name}."
            sensors[name] = SensorConfig(name=name, **body)
        limits = {}
        for name, body in raw_limits.items():
            where_prefix = f"limits.{name}."
            if not re.fullmatch(NAME, name):
                raise ConfigError(f"{source}: limits.{name}: a resource is named like a class "
                                  "(lowercase letters, digits, _ . -)")
            limits[name] = ResourceLimits(**body)
        keys = {}
        for name, body in raw_keys.items():
            where_prefix = f"keys.{name}."
            if not re.fullmatch(LIMIT_KEY, name):
                raise ConfigError(f"{source}: keys.{name}: a limit key is KIND:VALUE, such as "
                                  "repo:app or tenant:acme")
            keys[name] = KeyLimits(**body)
        where_prefix = ""
        config = LedgerConfig(classes=classes, sensors=sensors, limits=limits, keys=keys)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = where_prefix + ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{source}: {where}: {first['msg']}"
                          + (f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else "")
                          ) from exc
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    for each in config.classes.values():
        unknown_resources = sorted(set(each.uses) - set(config.limits))
        if unknown_resources:
            raise ConfigError(f"{source}: classes.{each.name}.uses: {', '.join(unknown_resources)} "
                              "has no [limits.RESOURCE] table")
    for sensor in config.sensors.values():
        # A sensor's campaign is attempted on, and promoted onto, its class's
        # repository: a target elsewhere would fix (and move) the wrong one.
        cls = config.classes.get(sensor.campaign_class)
        problem = cls.target_problem(sensor.target) if cls else None
        if problem:
            raise ConfigError(f"{source}: sensors.{sensor.name}.target: {problem}")
    return config


def load_config(path: Path) -> LedgerConfig:
    """Read and validate ``ledger.toml``."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found (set LEDGER_CONFIG or --config)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse_config(data, str(path))
