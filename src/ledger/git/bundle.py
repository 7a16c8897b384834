"""The verification bundle: what a verifier needs, frozen after the worker
committed -- base and candidate SHAs, the diff and its digest (the approach
fingerprint), the acceptance commands and the objective.

The worker writes it, so it says *what* to judge, never *how*: the verifier
takes the acceptance criteria and the verifier implementation from the
campaign and its class in the database (the bundle's copy is a record of what
the worker was told). Once a campaign is closed and ``ledger gc`` has deleted
its attempt branches, the bundle is what remains of each candidate: its SHA,
its diff and the digest over both.

It lives in the database with the attempt (the bundle as JSON, the diff as
bytes, and the digest over both), so every role on every machine reads the
same evidence and none needs the worker's disk; the digest makes a change
after recording detectable.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ledger.errors import LedgerError

BUNDLE_FILE = "bundle.json"
DIFF_FILE = "candidate.diff"


class BundleTampered(LedgerError):
    """The bundle on disk does not match the digest recorded when it was frozen."""

    slug = "bundle-tampered"
    http_status = 409
    exit_code = 11


class Bundle(BaseModel):
    """The frozen description of one candidate."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    campaign_id: int
    attempt_no: int
    generation: int
    worker: str
    class_: str = Field(alias="class")
    objective_key: str
    target: str
    repository: str
    base_ref: str
    base_sha: str
    candidate_sha: str
    fingerprint: str
    acceptance: dict[str, Any]
    verifier: str
    created_at: datetime


def fingerprint_of(diff: bytes) -> str:
    """The approach fingerprint: a digest of the candidate's diff."""
    return "sha256:" + hashlib.sha256(diff).hexdigest()


def _digest(bundle_json: bytes, diff: bytes) -> str:
    h = hashlib.sha256()
    for name, content in ((BUNDLE_FILE, bundle_json), (DIFF_FILE, diff)):
        h.update(name.encode() + b"\0" + str(len(content)).encode() + b"\0" + content)
    return "sha256:" + h.hexdigest()


def _canonical(bundle: Bundle) -> bytes:
    return json.dumps(bundle.model_dump(mode="json", by_alias=True), sort_keys=True,
                      separators=(",", ":")).encode()


def digest_of(bundle: Bundle, diff: bytes) -> str:
    """The digest a bundle and its diff are recorded with."""
    return _digest(_canonical(bundle), diff)


def verify(recorded: dict[str, Any] | None, diff: bytes | None, expected_digest: str | None) -> Bundle:
    """The bundle recorded with an attempt, checked against its digest
    (``BundleTampered`` if it does not match or is missing)."""
    if not recorded or not expected_digest:
        raise BundleTampered("the attempt has no frozen verification bundle")
    bundle = Bundle.model_validate(recorded)
    actual = digest_of(bundle, diff or b"")
    if actual != expected_digest:
        raise BundleTampered(f"the bundle recorded with the attempt does not match its digest "
                             f"(digest {actual}, recorded {expected_digest})")
    return bundle
