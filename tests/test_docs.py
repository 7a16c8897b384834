"""The documentation site (``mkdocs.yml``, ``docs/``): its reference pages are
generated from the code (``docs/gen.py``) and cover all of it, and the strict
build that ``.ci/run`` runs fails on a broken link, a broken anchor or a page
left out of the navigation."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from test_cli_failures import leaf_commands

from ledger import config, protocol
from ledger.cli.failures import EXIT_CODES
from ledger.settings import Settings

ROOT = Path(__file__).parents[1]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ledger_docs_gen", ROOT / "docs" / "gen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return generator().pages()


def test_the_configuration_reference_has_every_key_and_variable(pages: dict[str, str]) -> None:
    page = pages["reference/configuration.md"]
    from ledger.sandbox.cell import CellPolicy

    for model in (config.CampaignClassConfig, config.Backoff, config.Acceptance,
                  config.RoleAuthority, config.SensorConfig, CellPolicy, config.PytestJudge,
                  config.ScreenSettings, config.ScreenRule, config.HeldOut, config.Review):
        for name, field in model.model_fields.items():
            if name != "name":  # the table's own key
                assert f"| `{field.alias or name}` |" in page, (model.__name__, name)
    for name in Settings.model_fields:
        assert f"`LEDGER_{name.upper()}`" in page, name
    for _path, command in leaf_commands():
        for param in command.params:
            if getattr(param, "envvar", None):
                assert f"`{param.envvar}`" in page, param.envvar
    from ledger.settings import KNOBS

    for knob in KNOBS.values():  # every knob, with its default and its help
        row = next((line for line in page.splitlines() if line.startswith(f"| `{knob.envvar}`")),
                   None)
        assert row is not None, knob.envvar
        assert re.split(r"[(<>&`]", knob.help)[0][:30] in row, knob.envvar
        assert (knob.range_text().split(",")[0].replace(">", "&gt;") or "|") in row, knob.envvar


def test_the_cli_reference_has_every_command_and_option(pages: dict[str, str]) -> None:
    page = pages["reference/cli.md"]
    for path, command in leaf_commands():
        heading = f"## `ledger {' '.join(path)}`\n"
        assert heading in page, path
        section = page.split(heading, 1)[1].split("\n## ", 1)[0]
        for param in command.params:
            for flag in (o for o in param.opts if o.startswith("-")):
                assert re.search(rf"`[^`|]*(?<![\w-]){re.escape(flag)}(?![\w-])", section), (path, flag)


def test_the_error_reference_has_every_exit_code_and_class(pages: dict[str, str]) -> None:
    page = pages["reference/errors.md"]
    for code, _meaning in EXIT_CODES:
        assert f"\n| {code} | " in page, code
    for slug in ("stale-lease", "login-refused", "cannot-listen", "database-missing",
                 "unauthenticated", "check-failed", "git-error"):
        assert f"`{slug}`" in page, slug


def test_the_protocol_reference_has_every_field_variable_and_placeholder(
        pages: dict[str, str]) -> None:
    page = pages["reference/attempt-protocol.md"]
    for model in (protocol.AttemptContext, protocol.PreviousAttempt):
        for name, field in model.model_fields.items():
            assert f"| `{field.alias or name}` |" in page, name
    for variable in protocol.ENVIRONMENT:
        assert f"`{variable}`" in page
    for placeholder in protocol.PLACEHOLDERS:
        assert f"`{{{placeholder}}}`" in page
    assert '"additionalProperties": false' in page  # the JSON Schema


def test_the_quickstart_gives_the_readmes_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    for command in ("make demo", "make test"):
        assert f"\n{command}    #" in readme and f"\n{command}    #" in quickstart


def test_every_alarm_has_a_runbook() -> None:
    """Each alert of ops/prometheus/ledger-rules.yml has its runbook section in
    docs/alarms.md (what it means, what to look at, what to do), and the page
    has no runbook for an alert that is gone."""
    import yaml

    rules = yaml.safe_load((ROOT / "ops" / "prometheus" / "ledger-rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    page = (ROOT / "docs" / "alarms.md").read_text()
    runbooks = dict(re.findall(r"\n### (Ledger\w+)\n(.*?)(?=\n### |\Z)", page, re.S))
    assert set(runbooks) == alerts
    for alert, text in runbooks.items():
        assert "**Means.**" in text and ("**Do.**" in text or "**Look at / do.**" in text), alert


def test_the_metrics_reference_has_every_series_a_scrape_serves(pages: dict[str, str]) -> None:
    page = pages["reference/metrics.md"]
    for name in ("ledger_campaigns{class,state}", "ledger_transitions_total{transition}",
                 "ledger_hub_deaf", "ledger_campaigns_waiting{class,reason}",
                 "ledger_http_request_duration_seconds{method,route}"):
        assert f"| `{name}` |" in page, name
    # every name the alarms use is one the reference lists
    rules = (ROOT / "ops" / "prometheus" / "ledger-rules.yml").read_text()
    listed = set(re.findall(r"\| `(ledger_\w+)", page))
    assert set(re.findall(r"\b(ledger_[a-z_]+)\b", rules)) <= listed


def test_the_readmes_links_lead_somewhere() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert targets and all((ROOT / t).exists() for t in targets), \
        [t for t in targets if not (ROOT / t).exists()]


def build(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(site / "mkdocs.yml"), "-d", str(site / "out")],
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="mkdocs is not installed (the docs extra: make docs installs it)")
def test_the_strict_build_passes_and_fails_on_a_broken_link_anchor_or_page(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", site)
    shutil.copytree(ROOT / "docs", site / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    built = build(site)
    assert built.returncode == 0, built.stderr
    for page in ("reference/configuration", "reference/cli", "reference/errors",
                 "reference/attempt-protocol", "reference/metrics", "quickstart", "walkthrough",
                 "how-it-works", "running/cell", "deployment", "operations", "alarms", "api",
                 "figures"):
        assert (site / "out" / page / "index.html").is_file(), page
    index = site / "docs" / "index.md"
    original = index.read_text()
    breakages = {
        "no-such-page.md": ("index.md", original + "\n[gone](no-such-page.md)\n"),
        "no-such-part": ("index.md", original + "\n[gone](reference/cli.md#no-such-part)\n"),
        "orphan.md": ("orphan.md", "# Orphan\n"),  # a page left out of the navigation
    }
    for what, (name, text) in breakages.items():
        target = site / "docs" / name
        target.write_text(text)
        broken = build(site)
        said = broken.stdout + broken.stderr
        assert broken.returncode != 0, f"{what} passed the strict build"
        assert "strict mode" in said and what in said, said
        if name == "index.md":
            index.write_text(original)
        else:
            target.unlink()
