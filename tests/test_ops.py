"""The operations artefacts shipped in ``ops/``, checked by the real tools
against a real ``/metrics``.

A ``ledger serve`` process runs on the test's database with campaigns brought
(through the API) to what the alarms are about: one exhausted campaign, one
HTTP side effect pending with no dispatcher running. Its ``/metrics`` is
scraped, and every sample becomes a promtool input series (constant for an
hour, as if scraped each minute). ``promtool test rules`` then checks which
alerts of ``ops/prometheus/ledger-rules.yml`` fire: as scraped (exhausted and
outbox stalled, nothing else), and with the scraped series changed where no
test can make the real condition cheaply (a deaf hub, a filling notification
queue, campaigns held back by a system fault, an approval waiting for hours). A rule on a metric or label
that ``/metrics`` does not have fires on nothing, and the test fails.

The Grafana dashboard (``ops/grafana/ledger.json``): every query parses as
PromQL (promtool checks them as recording rules) and names only metrics the
real ``/metrics`` has. Skips, saying why, where promtool is not installed
(Debian's ``prometheus`` package).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import TEST_PREFIX, Actors, stop_process
from ledger.api import hash_token, new_token
from test_api_live import Server, _free_port, _wait_live

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "ops" / "prometheus" / "ledger-rules.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "ledger.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed "
                                    "(apt-get install prometheus)")
JOB = "ledger"
MINUTES = 60

Sample = tuple[str, dict[str, str], float]


@dataclass
class Scraped:
    make_state: Callable[[], Awaitable[None]]
    url: str
    token: str
    instance: str


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def scraped(db_url: str, actors: Actors, tmp_path: Path) -> Iterator[Scraped]:
    """A running ``ledger serve`` and how to bring the database to an
    exhausted campaign and a pending side effect."""
    async def make_state() -> None:
        operator, sensor, worker = await actors("operator"), await actors("sensor"), await actors("worker")
        await operator.register_class("ops", max_attempts=1, lease_seconds=30, backoff_base_s=0, backoff_jitter=0)
        # a sensor whose check keeps failing by itself (three errors in a row), and a healthy one
        now = datetime.now(timezone.utc)
        await sensor.record_observation("healthy", "objective-healthy", "repo", "green", now)
        for _ in range(3):
            await sensor.record_observation("unreachable", "objective-unreachable", "repo", "error", now,
                                            details={"error": "fatal: unable to connect"})
        cid = (await sensor.open_campaign("ops", "objective-exhausted", "repo")).campaign_id
        claim = await worker.claim_campaign("w", ["ops"])
        assert claim is not None and claim.campaign_id == cid
        await worker.fail_attempt(cid, claim.generation, "no luck")
        await operator.register_class("hooks", lease_seconds=3600, authority={"worker": {"hosts": ["127.0.0.1"]}})
        for n in (1, 2):  # the first carried out (as the dispatcher role), the second left waiting
            hook = (await sensor.open_campaign("hooks", f"objective-hook-{n}", "hook")).campaign_id
            held = await worker.claim_campaign("w", ["hooks"])
            assert held is not None and held.campaign_id == hook
            await worker.request_side_effect(hook, held.generation, kind="http.request",
                                             target="http://127.0.0.1:9/x", precondition={},
                                             idempotency_key=f"key-{n}",
                                             payload={"method": "POST", "url": "http://127.0.0.1:9/x", "body": {}})
            if n == 1:
                dispatcher = await actors("dispatcher")
                got = await dispatcher.claim_side_effect("d")
                assert got is not None and got.campaign_id == hook
                await dispatcher.confirm_side_effect(got.side_effect_id, got.claim_token)
                assert await dispatcher.complete_side_effect(got.side_effect_id, got.claim_token, "done") == "done"

        # a verified candidate waiting for a person
        await operator.register_class("gated", lease_seconds=30, approval={"mode": "always"})
        gated = (await sensor.open_campaign("gated", "objective-gated", "repo")).campaign_id
        leased = await worker.claim_campaign("w", ["gated"])
        assert leased is not None and leased.campaign_id == gated
        await worker.record_attempt(gated, leased.generation, base_sha="a" * 40, candidate_sha="b" * 40,
                                    fingerprint="sha256:gated-1")
        verifier = await actors("verifier")
        check = await verifier.claim_verification("v", classes=["gated"])
        assert check is not None
        await verifier.accept(check.verification_id, {})

    token = new_token()
    port = _free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "LEDGER_DATABASE_URL": db_url, "LEDGER_ROLE_PREFIX": TEST_PREFIX,
           "LEDGER_API_TOKENS": f"prom:reader:{hash_token(token)}", "LEDGER_LOG_LEVEL": "warning"}
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ledger", "serve", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        _wait_live(server)
        yield Scraped(make_state, server.url, token, f"127.0.0.1:{port}")
    finally:
        stop_process(proc)


async def scrape(scraped: Scraped) -> tuple[list[Sample], str]:
    """Make the state, then scrape: the samples and the instance (host:port)."""
    await scraped.make_state()
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{scraped.url}/metrics",
                                 headers={"Authorization": f"Bearer {scraped.token}"})).text
    samples = [(s.name, dict(s.labels), float(s.value))
               for family in text_string_to_metric_families(text) for s in family.samples]
    assert samples, text
    return samples, scraped.instance


def selector(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items())) + "}"


def series(samples: list[Sample], instance: str,
           changed: dict[tuple[str, tuple[tuple[str, str], ...]], float | str]) -> list[dict[str, str]]:
    """promtool input series: each sample (with the scrape's job and instance)
    constant for an hour, but where ``changed`` says otherwise (another
    constant, or promtool's own notation: ``"1+1x60"`` grows by one a minute)."""
    out = []
    for name, labels, value in samples:
        key = (name, tuple(sorted(labels.items())))
        v = changed.get(key, value)
        out.append({"series": selector(name, {**labels, "job": JOB, "instance": instance}),
                    "values": v if isinstance(v, str) else f"{v:g}+0x{MINUTES}"})
    missing = set(changed) - {(n, tuple(sorted(labels.items()))) for n, labels, _ in samples}
    assert not missing, f"changed series that /metrics does not have: {missing}"
    return out


def rendered(alert: str, labels: dict[str, str], value: float) -> dict[str, str]:
    """The alert's annotations as Prometheus renders them (the few template
    forms the rules file uses)."""
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    out = {}
    for key, text in rules[alert].get("annotations", {}).items():
        text = text.replace("{{ $value | humanizePercentage }}", f"{value * 100:g}%")
        text = text.replace("{{ $value }}", f"{value:g}")
        out[key] = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
    return out


def expect(alert: str, at: str, *fired: tuple[dict[str, str], float]) -> dict[str, Any]:
    severity = next(r["labels"]["severity"] for g in yaml.safe_load(RULES.read_text())["groups"]
                    for r in g["rules"] if r.get("alert") == alert)
    return {"eval_time": at, "alertname": alert,
            "exp_alerts": [{"exp_labels": {**labels, "severity": severity},
                            "exp_annotations": rendered(alert, labels, value)} for labels, value in fired]}


ALERTS = ("LedgerHubDeaf", "LedgerNotifyQueueFilling", "LedgerNotifyQueueNearlyFull", "LedgerOutboxStalled",
          "LedgerCampaignsExhausted", "LedgerSystemFaultsWaiting", "LedgerSensorErroring",
          "LedgerApprovalsAging")


@needs_promtool
def test_the_rules_file_passes_promtool_check() -> None:
    done = promtool("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    names = {r.get("alert") for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert set(ALERTS) <= names


@needs_promtool
async def test_the_alerts_fire_on_series_from_a_real_metrics_endpoint(scraped: Scraped, tmp_path: Path) -> None:
    samples, instance = await scrape(scraped)
    job = {"job": JOB}
    waiting = ("ledger_campaigns_waiting", (("class", "ops"), ("reason", "system_fault")))
    exhausted = ("ledger_campaigns", (("class", "ops"), ("state", "exhausted")))
    pending = ("ledger_side_effects_by_state", (("kind", "http.request"), ("state", "pending")))
    carried_out = ("ledger_side_effects_by_state", (("kind", "http.request"), ("state", "done")))
    approvals = ("ledger_approvals_waiting", (("class", "gated"),))
    aging = ("ledger_approval_oldest_age_seconds", (("class", "gated"),))
    deaf = ("ledger_hub_deaf", ())
    queue = ("ledger_notify_queue_usage", ())
    erroring = ("ledger_sensor_consecutive_errors", (("sensor", "unreachable"),))
    healthy = ("ledger_sensor_consecutive_errors", (("sensor", "healthy"),))
    present = {(n, tuple(sorted(labels.items()))): v for n, labels, v in samples}
    # the real state the alarms are about, as /metrics reports it
    assert present[exhausted] == 1 and present[pending] == 1 and present[carried_out] == 1
    assert present[waiting] == 0 and present[deaf] == 0 and present[queue] < 0.5
    assert present[erroring] == 3 and present[healthy] == 0
    assert present[approvals] == 1 and 0 <= present[aging] < 600

    as_scraped = {
        "interval": "1m", "name": "as scraped: an exhausted campaign, a side effect no dispatcher carries out",
        "input_series": series(samples, instance, {}),
        "alert_rule_test": [
            expect("LedgerCampaignsExhausted", "20m"),  # for 30m: not yet
            expect("LedgerCampaignsExhausted", "40m", ({**job, "class": "ops"}, 1)),
            expect("LedgerOutboxStalled", "10m"),  # waited less than 15 minutes
            expect("LedgerOutboxStalled", "40m", ({**job, "kind": "http.request"}, 1)),
            expect("LedgerSensorErroring", "3m"),  # for 5m
            expect("LedgerSensorErroring", "40m", ({**job, "sensor": "unreachable"}, 3)),
            *(expect(a, "40m") for a in ("LedgerHubDeaf", "LedgerNotifyQueueFilling",
                                         "LedgerNotifyQueueNearlyFull", "LedgerSystemFaultsWaiting",
                                         "LedgerApprovalsAging")),
        ],
    }
    faults = {
        "interval": "1m", "name": "a deaf hub, a filling queue, campaigns held by a system fault",
        "input_series": series(samples, instance, {deaf: 1, queue: 0.7, waiting: 2, exhausted: 0, pending: 0,
                                                   erroring: 2}),  # two errors in a row: not yet
        "alert_rule_test": [
            expect("LedgerHubDeaf", "3m"),  # for 5m
            expect("LedgerHubDeaf", "10m", ({**job, "instance": instance}, 1)),
            expect("LedgerNotifyQueueFilling", "10m", (job, 0.7)),
            expect("LedgerNotifyQueueNearlyFull", "10m"),
            expect("LedgerSystemFaultsWaiting", "5m"),  # for 10m
            expect("LedgerSystemFaultsWaiting", "20m", ({**job, "class": "ops", "reason": "system_fault"}, 2)),
            expect("LedgerCampaignsExhausted", "40m"),
            expect("LedgerOutboxStalled", "40m"),
            expect("LedgerSensorErroring", "40m"),
        ],
    }
    recovered = {
        "interval": "1m", "name": "a sensor that errs three times, then observes again",
        "input_series": series(samples, instance, {erroring: "3+0x10 0+0x50"}),
        "alert_rule_test": [expect("LedgerSensorErroring", "8m", ({**job, "sensor": "unreachable"}, 3)),
                            expect("LedgerSensorErroring", "20m")],
    }
    aged = {
        "interval": "1m", "name": "an approval waits, a minute older every minute",
        "input_series": series(samples, instance, {aging: f"3000+60x{MINUTES}"}),
        "alert_rule_test": [
            expect("LedgerApprovalsAging", "12m"),  # over an hour at 11m, for 5m: not yet
            expect("LedgerApprovalsAging", "17m", ({**job, "class": "gated"}, 3000 + 60 * 17)),
        ],
    }
    working = {
        "interval": "1m", "name": "the dispatcher carries one out now and then: not stalled",
        "input_series": series(samples, instance, {carried_out: f"1+1x{MINUTES}"}),
        "alert_rule_test": [expect("LedgerOutboxStalled", "40m")],
    }
    full = {
        "interval": "1m", "name": "the notification queue nearly full",
        "input_series": series(samples, instance, {queue: 0.95}),
        "alert_rule_test": [expect("LedgerNotifyQueueNearlyFull", "5m", (job, 0.95))],
    }
    shutil.copy(RULES, tmp_path / RULES.name)
    spec = tmp_path / "ledger-rules.test.yml"
    spec.write_text(json.dumps({"rule_files": [RULES.name], "evaluation_interval": "1m",
                                "tests": [as_scraped, faults, working, full, recovered, aged]},
                               indent=1))  # JSON is YAML
    done = promtool("test", "rules", spec)
    assert done.returncode == 0, done.stdout + done.stderr

    # and the test itself can fail: a rule on a name /metrics does not have fires on nothing
    (tmp_path / RULES.name).write_text(RULES.read_text().replace("ledger_hub_deaf", "ledger_hub_is_deaf"))
    broken = promtool("test", "rules", spec)
    assert broken.returncode != 0 and "LedgerHubDeaf" in broken.stdout + broken.stderr


def dashboard_queries() -> list[str]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            yield from (t["expr"] for t in panel.get("targets", []))
            yield from walk(panel.get("panels", []))
    return list(walk(json.loads(DASHBOARD.read_text())["panels"]))


@needs_promtool
async def test_the_dashboard_queries_parse_and_name_real_metrics(scraped: Scraped, tmp_path: Path) -> None:
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and board["uid"] and board["schemaVersion"] >= 30
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "class"}
    queries = dashboard_queries()
    assert len(queries) >= 10
    # Grafana's variables as Grafana would fill them in, then promtool parses each
    concrete = [q.replace("$__rate_interval", "5m").replace("$class", ".*") for q in queries]
    rules = tmp_path / "dashboard-queries.yml"
    rules.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": q} for i, q in enumerate(concrete)]}]}))
    done = promtool("check", "rules", rules)
    assert done.returncode == 0, done.stdout + done.stderr

    samples, _ = await scrape(scraped)
    names = {n for n, _, _ in samples}
    used = {m for q in queries for m in re.findall(r"\b(ledger_[a-z_]+)\b", q)}
    assert used and not used - names, f"the dashboard queries metrics /metrics does not have: {used - names}"
    rule_names = {m for m in re.findall(r"\b(ledger_[a-z_]+)\b", RULES.read_text())}
    assert not rule_names - names, f"the rules name metrics /metrics does not have: {rule_names - names}"
