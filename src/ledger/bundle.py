"""The verification bundle: what a verifier needs, frozen after the worker
committed -- base and candidate SHAs, the diff and its digest (the approach
fingerprint), the acceptance commands and the objective.

The worker writes it, so it says *what* to judge, never *how*: the verifier
takes the acceptance criteria and the verifier implementation from the
campaign and its class in the database (the bundle's copy is a record of what
the worker was told). Once a campaign is closed and ``ledger gc`` has deleted
its attempt branches, the bundle is what remains of each candidate: its SHA,
its diff and the digest over both.

It is written to the campaign's evidence location
(``<data_dir>/evidence/campaign-<id>/attempt-<n>/``); its content digest goes to
the database with the attempt, so an edit after freezing is detected.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .errors import LedgerError

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


def evidence_dir(data_dir: Path, campaign_id: int) -> Path:
    """Where a campaign's evidence lives."""
    return data_dir / "evidence" / f"campaign-{campaign_id}"


def freeze(bundle: Bundle, diff: bytes, campaign_dir: Path) -> tuple[Path, str]:
    """Write the bundle under ``campaign_dir``; return its directory and digest."""
    directory = campaign_dir / f"attempt-{bundle.attempt_no}"
    directory.mkdir(parents=True, exist_ok=True)
    content = _canonical(bundle)
    (directory / BUNDLE_FILE).write_bytes(content)
    (directory / DIFF_FILE).write_bytes(diff)
    return directory, _digest(content, diff)


def load(directory: Path, expected_digest: str) -> tuple[Bundle, bytes]:
    """Read a frozen bundle, refusing it unless its digest matches."""
    try:
        content = (directory / BUNDLE_FILE).read_bytes()
        diff = (directory / DIFF_FILE).read_bytes()
    except OSError as exc:
        raise BundleTampered(f"bundle at {directory} cannot be read: {exc}") from exc
    actual = _digest(content, diff)
    if actual != expected_digest:
        raise BundleTampered(f"bundle at {directory} was changed after it was frozen "
                             f"(digest {actual}, recorded {expected_digest})")
    return Bundle.model_validate_json(content), diff
