"""The acceptance spec: what a verifier runs on a clean checkout of a
candidate, and what a candidate may not change to pass it -- one model, used
end to end: ``ledger.toml`` (``ledger.config``), the copy the kernel stores
with each campaign and each bundle, the verifier (``ledger.roles.verifier``)
and the judge and its plugins (``ledger.verifiers``).

Written in ``ledger.toml`` an unknown key is refused (a typo must not pass);
read back from a row (``AcceptanceSpec.stored``) unknown keys are ignored and
missing ones take their defaults -- here, and only here -- so the specs that
every supported release stored still read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ledger.git import protection
from ledger.git.screen import check_settings
from ledger.sandbox.cell import CellPolicy
from ledger.sandbox.processes import check_extra
from ledger.verifiers.judge import JudgeError, JudgeSettings

#: The validation context of a spec read back from a row.
STORED = {"stored": True}


def _extras(value: list[str]) -> list[str]:
    for extra in value:
        check_extra(extra)
    return value


class _Spec(BaseModel):
    """Strict as written, tolerant as stored (``STORED`` context)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _as_stored(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, Mapping) and (info.context or {}).get("stored"):
            return {k: v for k, v in data.items() if k in cls.model_fields}
        return data


class PytestJudge(_Spec):
    """How a pytest acceptance command runs (``ledger.verifiers.judge``): the
    interpreter, the only plugins loaded, and where its configuration comes from."""

    python: str | None = Field(None, description="the interpreter (absolute path; default: the "
                                                 "command's own), started with -I")
    plugins: list[str] = Field(default_factory=list,
                               description="the only plugins loaded (by -p; auto-loading is off)")
    config: Literal["base", "class"] = Field(
        "base", description="base: the base commit's pytest configuration; class: ini below")
    ini: dict[str, Any] = Field(default_factory=dict,
                                description="with config = class: the pytest settings (INI style)")
    pythonpath: list[str] | None = Field(None, description="directories of the checkout put on "
                                                           "sys.path (default: the configuration's, and .)")

    @model_validator(mode="after")
    def _valid(self) -> PytestJudge:
        try:
            JudgeSettings.from_spec(self.model_dump())
        except JudgeError as exc:
            raise ValueError(str(exc)) from None
        return self


class ScreenRule(_Spec):
    """A screen rule of the class's own: added lines matching ``pattern``."""

    name: str = Field(min_length=1, max_length=64)
    pattern: str = Field(min_length=1, description="a regular expression")
    paths: list[str] = Field(default_factory=list, description="only in these path globs")
    why: str = Field("matches a rule of the class", description="what the finding says")


class ScreenSettings(_Spec):
    """What the verifier flags in the diff before running anything (``ledger.git.screen``)."""

    rules: list[str] | None = Field(None, description="the rules used (default: all; [] = off)")
    exempt: list[str] = Field(default_factory=list, description="paths not screened (gitignore-style)")
    extra: list[ScreenRule] = Field(default_factory=list, description="rules of the class's own")

    @model_validator(mode="after")
    def _valid(self) -> ScreenSettings:
        check_settings(self.model_dump())
        return self


class HeldOut(_Spec):
    """Tests the candidate never saw: a directory on the verifier's host, or a
    repository's ref fetched with the verifier's credentials; copied into the
    judge's checkout at ``into`` at verification time, never shown to attempts."""

    path: str | None = Field(None, description="a directory on the verifier's host")
    repository: str | None = Field(None, description="or a repository (path or URL) ...")
    ref: str = Field("main", description="... and its ref")
    subdir: str = Field("", description="the part of it to copy (default: all of it)")
    into: str = Field("tests/held_out", description="where in the checkout (relative)")
    commands: list[list[str]] = Field(default_factory=list, description=(
        "what runs them (default for the pytest verifier: pytest on `into`, by the judge)"))

    @model_validator(mode="after")
    def _one_source(self) -> HeldOut:
        if (self.path is None) == (self.repository is None):
            raise ValueError("held_out: give exactly one of path or repository")
        if self.path is not None and not self.path.startswith("/"):
            raise ValueError("held_out.path must be absolute")
        for relative in (self.into, self.subdir):
            pure = PurePosixPath(relative)
            if pure.is_absolute() or ".." in pure.parts:
                raise ValueError(f"held_out: {relative!r} must be relative, inside the tree")
        if not self.into.strip("/."):
            raise ValueError("held_out.into must name a directory of the checkout")
        return self


class Review(_Spec):
    """The ``review`` verifier: a command that gets the diff, the objective and
    the evidence as JSON on stdin and prints a verdict as JSON."""

    command: list[str] = Field(min_length=1, description="argv of the reviewer")
    timeout_s: float = Field(600.0, gt=0, description="seconds it may take")
    environment: list[str] = Field(default_factory=list,
                                   description="extra variables for it: NAME or NAME=VALUE")
    cell: CellPolicy = Field(default_factory=CellPolicy, description="the sandbox it runs in")

    _environment = field_validator("environment")(_extras)


class AcceptanceSpec(_Spec):
    """What the verifier runs on a clean checkout of the candidate, and what a
    candidate may not change to pass it."""

    commands: list[list[str]] = Field(default_factory=list,
                                      description="argv lists, run in order; all must pass")
    timeout_s: float = Field(600.0, gt=0, description="seconds each command may take")
    protected: list[str] | None = Field(
        None, description="gitignore-style patterns (or PATTERN#SECTION); default: derived "
                          "from the commands")
    allow_protected_changes: bool = Field(
        False, description="let a candidate change protected paths (it is judged by them)")
    environment: list[str] = Field(default_factory=list,
                                   description="extra variables for the commands: NAME or NAME=VALUE")
    cell: CellPolicy = Field(default_factory=CellPolicy,
                             description="the sandbox the acceptance commands run in (on the verifier)")
    pytest: PytestJudge = Field(default_factory=PytestJudge,
                                description="how pytest commands run (the fixed judge)")
    screen: ScreenSettings = Field(default_factory=ScreenSettings,
                                   description="what the diff is screened for before anything runs")
    held_out: HeldOut | None = Field(None, description="tests the candidate never sees")
    review: Review | None = Field(None, description="the reviewer command (verifier review)")

    @field_validator("commands")
    @classmethod
    def _argv(cls, value: list[list[str]]) -> list[list[str]]:
        for argv in value:
            if not argv or not argv[0]:
                raise ValueError("each acceptance command is a non-empty argv list")
        return value

    @field_validator("protected")
    @classmethod
    def _patterns(cls, value: list[str] | None) -> list[str] | None:
        for pattern in value or []:
            protection.check_pattern(pattern)
        return value

    _environment = field_validator("environment")(_extras)

    @classmethod
    def stored(cls, raw: Mapping[str, Any] | None) -> AcceptanceSpec:
        """A spec as a row has it (the campaign's criteria, a bundle's):
        unknown keys ignored, missing ones defaulted; ``ValueError`` (a
        pydantic ``ValidationError``) if what is there is not a spec."""
        return cls.model_validate(dict(raw or {}), context=STORED)

    def effective(self) -> dict[str, Any]:
        """The spec as stored with campaigns and bundles: the protected
        patterns resolved (the defaults written out), the cell as the
        previous release can still read it (``CellPolicy.stored``)."""
        spec = self.model_dump()
        spec["protected"] = (self.protected if self.protected is not None
                             else protection.default_patterns(self.commands))
        spec["cell"] = self.cell.stored()
        return spec
