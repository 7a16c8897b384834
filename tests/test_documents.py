"""Stored documents are typed once and loaded at the boundary: the acceptance
spec (``ledger.verifiers.spec``) and the side effects' and the merge queue's
documents (``ledger.db.documents``). Written in ``ledger.toml`` a spec is
strict; read back from a row, keys another release wrote or left out are
ignored or defaulted -- in one place."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from ledger import config, verifiers
from ledger.db.documents import (
    ApprovalPolicy,
    GitPayload,
    GitPrecondition,
    HttpPayload,
    InvalidDocument,
    Landing,
    Observation,
    ObservationDetails,
    QueueView,
)
from ledger.verifiers.spec import AcceptanceSpec

ROOT = Path(__file__).resolve().parent.parent

#: An acceptance spec as release 0.1.0 stored it with a campaign: no screen,
#: review or pytest table, a cell in the old shape, a key since dropped.
STORED_0_1 = {"commands": [["python", "-m", "pytest", "-q"]], "timeout_s": 300,
              "protected": ["tests/**"], "environment": [], "cell": {"sandbox": True},
              "allow_protected_changes": False, "verifier": "pytest",
              "held_out": {"path": "/srv/held", "note": "from an older release"}}


def test_the_config_the_verifier_and_the_judge_share_one_acceptance_class() -> None:
    assert config.Acceptance is AcceptanceSpec
    assert config.CampaignClassConfig.model_fields["acceptance"].annotation is AcceptanceSpec


def test_a_stored_spec_of_an_older_release_reads_with_the_defaults() -> None:
    spec = AcceptanceSpec.stored(STORED_0_1)
    assert spec.held_out is not None
    assert (spec.held_out.into, spec.held_out.ref, spec.held_out.subdir) == ("tests/held_out", "main", "")
    assert spec.screen.rules is None and spec.review is None and spec.pytest.config == "base"
    assert spec.commands == [["python", "-m", "pytest", "-q"]] and spec.timeout_s == 300
    run = verifiers.Acceptance.from_spec(spec)
    assert run.commands == (("python", "-m", "pytest", "-q"),) and run.timeout_s == 300
    # a mapping is read as a stored spec, the same way
    assert verifiers.Acceptance.from_spec(STORED_0_1).commands == run.commands
    assert AcceptanceSpec.stored(None).commands == [] and AcceptanceSpec.stored({}).held_out is None


def test_a_written_spec_is_strict_and_a_stored_one_still_checked() -> None:
    with pytest.raises(ValidationError, match="verifier"):
        AcceptanceSpec.model_validate(STORED_0_1)  # in ledger.toml an unknown key is a typo
    with pytest.raises(ValidationError, match="timeout_s"):
        AcceptanceSpec.stored({**STORED_0_1, "timeout_s": 0})
    with pytest.raises(verifiers.InvalidAcceptance, match="no commands"):
        verifiers.Acceptance.from_spec({"commands": [], "timeout_s": 1})
    with pytest.raises(verifiers.InvalidAcceptance, match="commands"):
        verifiers.Acceptance.from_spec({"commands": [[]]})
    assert verifiers.Acceptance.from_spec({}, require_commands=False).commands == ()


def test_the_held_out_default_is_written_once() -> None:
    """Changing where held-out tests go is a change to one line of one file."""
    found = [str(p.relative_to(ROOT)) for folder in ("src", "verifiers")
             for p in (ROOT / folder).rglob("*.py")
             if re.search(r"""["']tests/held_out["']""", p.read_text())]
    assert found == ["verifiers/spec.py"]


def test_side_effect_documents_load_tolerantly_and_refuse_what_is_not_one() -> None:
    landing = {"campaign_id": 7, "attempt_no": 2, "verifier": "v-1", "model_family": "none",
               "summary": "ok", "verified_at": 1_700_000_000, "shown_by": "a later release"}
    payload = GitPayload.load({"repository": "/r", "new": "a" * 40, "landing": landing})
    assert payload.landing is not None and payload.candidate_ref is None
    # a landing of 0.1.0 has no verdicts list: its own verifier is the one verdict
    [only] = payload.landing.all_verdicts()
    assert (only.verifier, only.summary) == ("v-1", "ok")
    assert GitPrecondition.of({}).given is False
    assert GitPrecondition.of({"old": None}) == GitPrecondition(old=None, given=True)
    with pytest.raises(InvalidDocument, match=r"payload\.landing\.verified_at"):
        GitPayload.load({"landing": {**landing, "verified_at": "soon"}}, what="payload")
    with pytest.raises(InvalidDocument, match=r"payload\.headers"):
        HttpPayload.load({"method": "POST", "headers": ["not", "a", "map"]}, what="payload")
    assert Landing.load(landing).stored()["verdicts"] == []


def test_the_merge_queue_view_loads_once_with_its_defaults() -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    view = QueueView.load({
        "now": now.isoformat(), "policy": {"batch_size": 4},
        "batch": None, "last": {"id": 3, "base_sha": "b" * 40, "members": [1, 2], "stack": ["c", "d"],
                                "changes": [{}, {"old": "e"}], "probe_generation": 5,
                                "state": "failed", "closed_at": now.isoformat()},
        "queue": [{"campaign_id": 1, "generation": 2, "side_effect_id": 9, "queued_at": now.isoformat(),
                   "change": {"old": "o", "new": "n", "candidate_ref": "refs/x"}}]})
    assert view.policy.batch_size == 4 and view.policy.max_wait_s == 0.0
    assert view.last is not None and view.last.suspect is None and view.last.changes[1].old == "e"
    assert view.queue[0].change.candidate_ref == "refs/x" and view.queue[0].queued_at == now


def test_observation_details_store_what_the_check_set_and_read_back_tolerantly() -> None:
    details = ObservationDetails(command=["pytest"])
    details.exit_code, details.output = None, ""  # killed: no exit code, and that is said
    details.tests = {"collected": 3, "failed": ["t.py::a"], "judged": True, "passed_ids": ["t.py::b"]}
    stored = details.stored()
    assert stored == {"command": ["pytest"], "exit_code": None, "output": "",
                      "tests": {"collected": 3, "failed": ["t.py::a"], "judged": True,
                                "passed_ids": ["t.py::b"]}}
    report = details.report()
    assert report is not None and report.judged is True and report.failed == ["t.py::a"]
    # an opening observation of an older release: unknown keys, no tests at all
    opening = Observation.load({"status": "red", "details": {"legacy": 1, "exit_code": 1},
                                "started_at": "2025-05-01T00:00:00+00:00"})
    assert opening.details.tests is None and opening.details.exit_code == 1
    assert opening.started_at == datetime(2025, 5, 1, tzinfo=timezone.utc)
    assert ApprovalPolicy.load({"mode": "when", "when": [{"quorum_split": True}]}).asks_on_quorum_split()
    assert not ApprovalPolicy.load({"mode": "when", "when": ["protected_paths"]}).asks_on_quorum_split()
    assert ApprovalPolicy.load({"mode": "always"}).asks_on_quorum_split()
    assert not ApprovalPolicy.load({}).asks_on_quorum_split()
