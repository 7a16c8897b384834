"""The JSON documents stored in rows, one pydantic model each: a side
effect's payload and precondition, a promotion's landing, the merge queue's
members, batches and view.

Each is loaded once, at the boundary (``load``), and passed on typed. Loading
is tolerant of the rows of every supported release: unknown keys are
ignored, keys a release did not write take their defaults here (and only
here). A document that is not one (a worker's malformed payload) raises
``InvalidDocument`` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

D = TypeVar("D", bound="Document")


class InvalidDocument(ValueError):
    """A stored document that does not have the shape of its model."""


class Document(BaseModel):
    """A stored document: unknown keys ignored, missing ones defaulted."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True,
                              coerce_numbers_to_str=True)

    @classmethod
    def load(cls: type[D], raw: Mapping[str, Any] | None, *, what: str | None = None) -> D:
        """``raw`` (a row's JSON; ``None``: empty) as this document, or
        ``InvalidDocument`` naming ``what`` and the field at fault."""
        try:
            return cls.model_validate(dict(raw or {}))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in (what or cls.__name__, *first["loc"]))
            raise InvalidDocument(f"{where}: {first['msg']}") from None

    def stored(self) -> dict[str, Any]:
        """As written to a row (JSON types, keys as the schema names them)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=False)


# --- side effects ------------------------------------------------------------------


class Committer(Document):
    """Who commits a landed promotion (the class's ``promotion.committer``)."""

    name: str
    email: str


class LandingVerdict(Document):
    """One verifier's acceptance, as a landed commit's Ledger-Verdict trailer quotes it."""

    verifier: str
    kind: str | None = None
    model_family: str | None = None
    summary: str | None = None


class Landing(Document):
    """What a promotion's landed commit says, frozen with the intent
    (``accept_verification``), so every dispatcher builds the same commit."""

    campaign_id: int
    attempt_no: int
    verifier: str | None = None
    model_family: str | None = None
    summary: str | None = None
    #: one per verifier of the quorum, in its order (0.1.0 wrote none: the
    #: landing's own verifier is then the one verdict)
    verdicts: list[LandingVerdict] = Field(default_factory=list)
    committer: Committer | None = None
    #: the verdict's time, seconds since the epoch (the commit's date)
    verified_at: int

    def all_verdicts(self) -> list[LandingVerdict]:
        """The verdicts the commit quotes."""
        if self.verdicts:
            return list(self.verdicts)
        return [LandingVerdict(verifier=self.verifier or "a verifier",
                               model_family=self.model_family, summary=self.summary)]


class GitPayload(Document):
    """A ``git.update_ref`` intent's payload."""

    repository: str | None = None
    new: str | None = None
    candidate_ref: str | None = None
    #: a promotion's: what the commit that lands says
    landing: Landing | None = None


class GitPrecondition(Document):
    """A ``git.update_ref`` intent's precondition: where the ref must be
    (``old``; ``None``: it must not exist). ``given`` says whether ``old`` was
    written at all: a blind ref update is never made."""

    old: str | None = None
    given: bool = False

    @classmethod
    def of(cls, raw: Mapping[str, Any] | None) -> GitPrecondition:
        """The precondition of a row, saying whether it names ``old``."""
        raw = raw or {}
        old = raw.get("old")
        return cls(old=None if old is None else str(old), given="old" in raw)


class ReadBack(Document):
    """How an HTTP intent is read back: ``GET url`` answering ``expect_status``."""

    url: str | None = None
    expect_status: int = 200


class HttpPayload(Document):
    """An ``http.request`` intent's payload."""

    method: str = ""
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any = None
    read_back: ReadBack | None = None


class HttpPrecondition(Document):
    """An ``http.request`` intent's precondition: conditional request headers."""

    if_match: str | int | None = None
    if_none_match: str | int | None = None


# --- observations and classes -------------------------------------------------------


class TestsReport(Document):
    """What a check's tests said (``details.tests``): the judge's summary, or
    a wrapper's junit report (which has no ``judged``)."""

    collected: int | None = None
    failed: list[str] = Field(default_factory=list)
    skipped: int | None = None
    passed: int | None = None
    #: whether the judge can trust the run (absent: not judged)
    judged: bool | None = None
    problems: list[str] = Field(default_factory=list)


class ObservationDetails(Document):
    """What a sensor's check saw (an observation's ``details``), written as
    the check goes (every field it set is stored, ``None`` included) and read
    back tolerantly."""

    model_config = ConfigDict(frozen=False)

    command: list[str] | None = None
    url: str | None = None
    ref: str | None = None
    sha: str | None = None
    exit_code: int | None = None
    status_code: int | None = None
    output: str | None = None
    body: str | None = None
    #: why the check could not tell (an error reading)
    error: str | None = None
    #: the error is the host's (its checkout, its cell), not the target's
    system_fault: bool | None = None
    leftovers: list[Any] | None = None
    sandboxed: bool | None = None
    limits: dict[str, Any] | None = None
    #: the tests' report (``TestsReport``; the judge's summary has more keys)
    tests: dict[str, Any] | None = None
    duration_s: float | None = None

    def stored(self) -> dict[str, Any]:
        """As written to the observation: the fields the check set."""
        return self.model_dump(mode="json", exclude_unset=True)

    def report(self) -> TestsReport | None:
        """The tests' report, if the check has one."""
        return TestsReport.load(self.tests, what="details.tests") if self.tests is not None else None


class Observation(Document):
    """An observation as a campaign keeps the one that opened it."""

    details: ObservationDetails = Field(default_factory=ObservationDetails)
    started_at: datetime | None = None


class ApprovalPolicy(Document):
    """A class's approval policy as registered (docs/approval.md)."""

    #: always, when (a condition holds) or absent: never
    mode: str | None = None
    when: list[Any] = Field(default_factory=list)

    def asks_on_quorum_split(self) -> bool:
        """Whether a verdict that asks for a person goes to one."""
        return self.mode == "always" or self.mode == "when" and any(
            isinstance(c, Mapping) and c.get("quorum_split") for c in self.when)


class PromotionTarget(Document):
    """A class's promotion as registered: where its verified candidates land."""

    ref: str | None = None
    repository: str | None = None


# --- the merge queue ------------------------------------------------------------


class QueueChange(Document):
    """A queued promotion's own change and verdict, as its intent had them."""

    old: str | None = None
    new: str | None = None
    candidate_ref: str | None = None
    landing: Landing | None = None


class QueueMember(Document):
    """A verified candidate waiting in its target's queue."""

    campaign_id: int
    generation: int
    side_effect_id: int
    queued_at: datetime
    change: QueueChange


class QueuePolicy(Document):
    """The class's merge-queue knobs (``promotion.merge_queue``)."""

    batch_size: int = 8
    max_wait_s: float = 0.0


BatchState = Literal["verifying", "landing", "landed", "failed", "dissolved"]


class MergeBatch(Document):
    """A row of ``ledger.merge_batch``: candidates stacked on one target."""

    id: int
    base_sha: str
    #: campaigns, bottom of the stack first; the last is the probe
    members: list[int]
    generations: list[int] = Field(default_factory=list)
    stack: list[str]
    changes: list[QueueChange]
    probe_generation: int
    suspect: int | None = None
    #: the commits that land, frozen before the push
    landed: list[str] | None = None
    #: the row's ``state`` (a batch's, not a campaign's)
    batch_state: BatchState = Field(alias="state")


class QueueView(Document):
    """``merge_queue_view``: the claimed promotion's queue."""

    policy: QueuePolicy = Field(default_factory=QueuePolicy)
    now: datetime
    #: its target's open batch
    batch: MergeBatch | None = None
    #: the last batch the target closed
    last: MergeBatch | None = None
    #: the waiting members, in order
    queue: list[QueueMember] = Field(default_factory=list)
