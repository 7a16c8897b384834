"""Public names are held to one list (``ledger.interface``): a rename in the
code, or a name added without being listed, fails here -- whether a span
attribute, a span, a metric family, an exit code or a field of ``--json``."""

from __future__ import annotations

import ast
import inspect
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

import ledger
from ledger import interface, tracing
from ledger.api import metrics
from ledger.cli import campaigns as cli_campaigns
from ledger.cli.failures import EXIT_CODES
from ledger.db import models
from ledger.errors import LedgerError
from test_cli import ledger as run_ledger

SRC = Path(ledger.__file__).parent
#: A name in the shape of a span or attribute name: ``ledger.`` and dotted words.
DOTTED = re.compile(r"ledger(\.[a-z_]+)+")


def _traced_names() -> dict[str, str]:
    return {k: v for k, v in vars(tracing).items()
            if k.isupper() and isinstance(v, str) and v.startswith("ledger.")}


def test_the_span_names_and_attributes_are_the_listed_ones() -> None:
    declared = set(_traced_names().values())
    assert declared == interface.SPANS | interface.SPAN_ATTRIBUTES
    assert interface.SPANS.isdisjoint(interface.SPAN_ATTRIBUTES)
    # the roles' identities, under the names dashboards were built on
    assert {tracing.WORKER, tracing.VERIFIER, tracing.DISPATCHER, tracing.SENSOR} == {
        "ledger.worker", "ledger.verifier", "ledger.dispatcher", "ledger.sensor"}


def test_no_module_writes_a_span_name_or_attribute_of_its_own() -> None:
    """Every span name and attribute key goes through ``ledger.tracing``'s
    constants: a literal ``"ledger.x"`` as a dict key or as the name given to a
    tracing call anywhere in src/ would escape the list."""
    calls = {"traced", "step", "start_span", "update_name", "set_attribute", "observation"}
    found: dict[str, list[str]] = {}
    for path in SRC.rglob("*.py"):
        if path.name == "interface.py":
            continue
        where = str(path.relative_to(SRC))
        for node in ast.walk(ast.parse(path.read_text())):
            literals: list[ast.expr] = []
            if isinstance(node, ast.Dict):
                literals = [k for k in node.keys if k is not None]
            elif isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if name in calls:
                    literals = list(node.args[:1])
            for literal in literals:
                if (isinstance(literal, ast.Constant) and isinstance(literal.value, str)
                        and DOTTED.fullmatch(literal.value)):
                    found.setdefault(where, []).append(literal.value)
    assert found == {}


def test_the_metric_families_are_the_listed_ones() -> None:
    one = [(1.0, 0, 0.0), (float("inf"), 0, 0.0)]
    snapshot = metrics.Snapshot(
        states={"ready": 0}, class_states={("c", "ready"): 0}, oldest_ready_age_s=None,
        transitions={"claim": 0}, attempts={"failed": 0}, verifications={},
        side_effects={("git.update_ref", "pending"): 0}, attempt_durations=one,
        verification_durations=one, waiting={("c", "target"): 0},
        sensor_outcomes={("s", "error"): 0}, sensor_errors={"s": 0}, approvals={"c": (0, 0.0)},
        approval_decisions={("approved", "operator"): 0}, not_ready={"worker": 0},
        limit_keys=[models.LimitKey(key="repo:app", max_leased=1, max_verifying=None, max_cost_per_day=None,
                                    weight=1, leased=0, verifying=0, cost_today=0.0, cost_total=0.0,
                                    updated_at=datetime.now(timezone.utc), updated_by=None)],
        limit_buckets=[models.LimitBucket(resource="m", requests_per_minute=60.0, tokens_per_minute=None,
                                          requests=0, tokens=0, request_wait_s=0.0, token_wait_s=0.0,
                                          updated_at=datetime.now(timezone.utc), updated_by=None)],
        usage=[models.ClassUsage.model_validate({"class": "c", "tokens_in": 0, "tokens_out": 0, "requests": 0,
                                                 "cost": 0.0, "cost_today": 0.0, "attempts": 0})],
        limits_waiting={("c", "limit"): 0})
    hub = SimpleNamespace(reconnects=0, connected=True, deaf=False, misses=0, dropped=0)
    process = metrics.ProcessCounters()
    process.count_request("GET", "/status", 200, 0.01)
    served = {}
    for family in metrics.LedgerCollector(snapshot, hub, process).collect():  # type: ignore[arg-type]
        name = family.name + ("_total" if family.type == "counter" else "")
        served[name] = frozenset(k for s in family.samples for k in s.labels if k != "le")
    assert served == interface.METRICS


def test_the_exit_codes_are_the_listed_ones() -> None:
    assert {code for code, _ in EXIT_CODES} == interface.EXIT_CODES
    classes, todo = set(), [LedgerError]
    while todo:
        cls = todo.pop()
        classes.add(cls)
        todo.extend(cls.__subclasses__())
    # every error the command line can end with has its code in the table (the
    # HTTP API's own, such as a missing bearer token, never reach a command)
    assert {c.exit_code for c in classes
            if not c.__module__.startswith("ledger.api.")} <= interface.EXIT_CODES


def _status_fields() -> dict[str, frozenset[str]]:
    """The keys of the dict ``ledger status --json`` prints, and of the items
    of each of its lists, read from the command's own source."""
    tree = ast.parse(inspect.getsource(cli_campaigns.status).lstrip())
    [emitted] = [n.args[0] for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", "") == "emit_json" and isinstance(n.args[0], ast.Dict)]
    fields = {"status": frozenset(str(k.value) for k in emitted.keys if isinstance(k, ast.Constant))}
    for key, value in zip(emitted.keys, emitted.values):
        if isinstance(key, ast.Constant) and isinstance(value, ast.ListComp):
            assert isinstance(value.elt, ast.Dict)
            fields[f"status.{key.value!s}"] = frozenset(
                str(k.value) for k in value.elt.keys if isinstance(k, ast.Constant))
    return fields


@pytest.mark.anyio
async def test_the_json_fields_of_the_commands_are_the_listed_ones(db_url: str,
                                                                  test_class: str) -> None:
    opened = json.loads(run_ledger(db_url, "open", test_class, "names-1", "repo-1", "--json").stdout)
    listed = json.loads(run_ledger(db_url, "list", "--json").stdout)
    shown = json.loads(run_ledger(db_url, "show", str(opened["campaign_id"]), "--json").stdout)
    status = json.loads(run_ledger(db_url, "status", "--json").stdout)
    printed = {"open": set(opened), "list": set(listed[0]), "show": set(shown),
               "show.campaign": set(shown["campaign"]), "status": set(status)}
    assert printed == {k: set(interface.CLI_JSON[k]) for k in printed}
    nested = _status_fields()
    assert nested["status"] == set(status)
    assert nested == {k: v for k, v in interface.CLI_JSON.items() if k.startswith("status")}
