"""The attempt protocol: what an attempt command is given and what it may give back.

A class's ``attempt_command`` runs in a cell (``ledger.sandbox.cell``), in a clone of
its own of the campaign's base at ``/cell/work`` (its working directory). It
is told what to do by a JSON document (``AttemptContext``), at
``/cell/campaign.json`` and also on its standard input; its argv may name
that file and a few values by placeholder (``PLACEHOLDERS``); its environment
is the locale, the cell's ``PATH``, ``HOME`` and ``TMPDIR``, the class's
``attempt_environment`` and the variables of ``ENVIRONMENT``. It answers by
changing files in its clone (and committing, if it likes: the worker takes
every commit since the base and whatever is left uncommitted), optionally
writing the commit message to ``commit_message_file`` (in ``/cell/out``),
and by its exit status (``EXIT_STATUS``). A class opted out of the cell
(``cell.sandbox = false``) gets host paths instead of the cell's.

This module is the contract's one description: the worker builds the
document from ``AttemptContext`` (``ledger.roles.attempt``), the reference page of
the documentation is generated from this module, and ``tests/test_protocol.py``
runs a real attempt and checks that what the command received is what is
written here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Outcome = Literal["running", "attempted", "failed", "lost", "drained", "released", "abandoned"]


class PreviousAttempt(BaseModel):
    """An earlier attempt of the same campaign, as the next one is told of it."""

    model_config = ConfigDict(extra="forbid")

    attempt_no: int = Field(description="Its number (1 is the first attempt of the campaign).")
    outcome: Outcome = Field(description="How it ended: `attempted` (a candidate was recorded), "
                                         "`failed`, `lost` (its lease lapsed), `drained`, "
                                         "`released` (a fault that was not its own: not "
                                         "counted) or `abandoned`.")
    verdict: Literal["accepted", "rejected"] | None = Field(
        description="The verifier's verdict on its candidate, if one was given.")
    failure_reason: str | None = Field(
        description="Why it failed, or why the verifier rejected its candidate.")
    fingerprint: str | None = Field(
        description="The fingerprint of its change (a digest of the diff); `null` if it "
                    "changed nothing.")


class AttemptContext(BaseModel):
    """The campaign file: what an attempt command is told (``campaign.json``
    and its standard input carry the same document)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    campaign_id: int = Field(description="The campaign being attempted.")
    attempt_no: int = Field(description="This attempt's number within the campaign (1, 2, ...).")
    generation: int = Field(description="The lease's generation: every write of this attempt "
                                        "is fenced by it.")
    class_: str = Field(alias="class", description="The campaign class (a `[classes.NAME]` "
                                                    "table of `ledger.toml`).")
    objective_key: str = Field(description="What must become true, e.g. `tests-pass:repo#main`.")
    target: str = Field(description="The watched target, e.g. `repo#main`.")
    desired_state: dict[str, Any] = Field(description="What the opener asked for (free-form).")
    opening_observation: dict[str, Any] = Field(
        description="The observation that opened the campaign (e.g. the failing test output).")
    acceptance: dict[str, Any] = Field(
        description="What the verifier will run on a clean checkout of the candidate: "
                    "`commands`, `timeout_s`, `protected`, `allow_protected_changes`, "
                    "`environment`.")
    protected: list[str] = Field(
        description="Paths the candidate may not change (gitignore-style patterns): the tests "
                    "and what configures them.")
    allow_protected_changes: bool = Field(
        description="Whether changes to protected paths are allowed for this campaign.")
    commit_message_file: str = Field(
        description="Where the command may write the candidate's commit message.")
    base_ref: str = Field(description="The ref the clone was made from (the class's "
                                      "`base_ref`).")
    base_sha: str = Field(description="The commit the clone was made from.")
    worktree: str = Field(description="The clone to change, a repository of its own (also the "
                                      "command's working directory).")
    previous_attempts: list[PreviousAttempt] = Field(
        description="The campaign's earlier attempts, oldest first.")
    refused_fingerprints: list[str] = Field(
        description="Fingerprints of changes that already failed or were rejected: a change "
                    "with one of them is refused (the next attempt must differ).")
    sandboxed: bool = Field(description="Whether the command runs in a cell (the default).")
    network: Literal["none", "proxy", "host"] = Field(
        description="What the command may reach: `none`, `proxy` (only the class's "
                    "`cell.allow` hosts, through `HTTPS_PROXY`) or `host`.")


#: The prefix of a usage line: ``LEDGER_USAGE {"tokens_in": 1200, ...}`` on a
#: line of its own, on the command's standard output or error.
USAGE_PREFIX = "LEDGER_USAGE "
#: The longest usage line read (a longer one is refused, whole).
USAGE_LINE_BYTES = 4096
#: The most usage lines taken from one attempt (later ones are refused).
USAGE_REPORTS = 10000


class UsageReport(BaseModel):
    """What the attempt used since its previous report (increments, not
    totals): one JSON object after ``LEDGER_USAGE `` on a line of its own,
    printed as it goes and at its end. Ledger adds it to the attempt's usage,
    the campaign's spend (against the class's ``max_cost``), the day's spend of
    each of its limit keys, and the token buckets of the resources the class
    ``uses``. A line that is not this -- not JSON, an unknown field, a
    negative, fractional or absurd figure, a string for a number -- is
    refused as a whole, journaled as ``usage.refused`` with the reason, and
    nothing else of the attempt is lost."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tokens_in: int = Field(0, ge=0, le=1_000_000_000, description="Input (prompt) tokens.")
    tokens_out: int = Field(0, ge=0, le=1_000_000_000, description="Output (completion) tokens.")
    requests: int = Field(0, ge=0, le=1_000_000, description="Requests made to the provider.")
    cost: float = Field(0.0, ge=0, le=1_000_000, allow_inf_nan=False,
                        description="What it cost, in the currency unit of the class's budgets.")


#: The placeholders an ``attempt_command`` argument may contain (``str.format``).
PLACEHOLDERS: dict[str, str] = {
    "campaign_file": "the path of `campaign.json`",
    "worktree": "the path of the clone to change",
    "campaign_id": "the campaign's id",
    "attempt_no": "the attempt's number",
}

#: The variables Ledger sets for an attempt command, besides the allow-list
#: (``ledger.sandbox.processes.ALLOWED``, ``LC_*``), the private temporary directory
#: (``TMPDIR``, ``TMP``, ``TEMP``) and the class's ``attempt_environment``.
ENVIRONMENT: dict[str, str] = {
    "LEDGER_CAMPAIGN_FILE": "the path of `campaign.json`",
    "LEDGER_CAMPAIGN_ID": "the campaign's id",
    "LEDGER_ATTEMPT_NO": "the attempt's number",
    "LEDGER_WORKTREE": "the path of the clone to change",
    "LEDGER_OBJECTIVE": "the objective key",
    "LEDGER_COMMIT_MESSAGE_FILE": "where the command may write the commit message",
}

#: What the command's ending means, in the order the worker judges it.
EXIT_STATUS: tuple[tuple[str, str], ...] = (
    ("it cannot be started", "the attempt fails: `could not start the attempt command ...`"),
    ("it runs past `attempt_timeout_s`", "its whole process group is killed; the attempt fails "
                                         "(`timed out`)"),
    ("it exits non-zero", "the attempt fails; the reason quotes the last three lines of its "
                          "output"),
    ("it exits 0 having changed nothing", "the attempt fails: `succeeded but changed nothing`"),
    ("it exits 0, changing a protected path", "the candidate is refused before verification "
                                              "(unless `allow_protected_changes`), recorded "
                                              "as a security event"),
    ("it exits 0 with a change whose fingerprint is in `refused_fingerprints`",
     "the attempt fails (repeated approach): the next attempt must differ"),
    ("it exits 0 with a change", "the change is committed (its message from "
                                 "`commit_message_file`, with `Ledger-Campaign` and "
                                 "`Ledger-Attempt` trailers) and recorded as the candidate; "
                                 "an independent verifier judges it"),
)
