"""OpenTelemetry spans (ledger.tracing): the campaign keeps the trace context
of its open, and every step's span joins that trace.

Unit level, with the SDK's in-memory exporter: the shape of each step's span
(parent, links, attributes), the database refusing a malformed context, and
nothing recorded or stored while tracing is off. End to end: a sensor, a
worker, a verifier and a dispatcher, each a separate ``ledger`` process
exporting by OTLP/HTTP to a receiver this test runs on loopback (the protobuf
decoded with opentelemetry-proto), close a regression in one trace, the
first attempt failing and its retry linked to the open."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console

from ledger import Database, tracing
from ledger.db.models import Claim
from ledger.errors import InvalidInput
from ledger.ops.drill import Drill, DrillContext, drill_python
from ledger.sandbox.processes import cell_environment, child_environment

pytestmark = pytest.mark.anyio


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    try:
        yield exporter
    finally:
        tracing.use(None)
        provider.shutdown()


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def _observe(kernel, objective: str, status: str, class_: str | None):
    return await tracing.observation(
        kernel.executor, objective, status, {tracing.CAMPAIGN_CLASS: class_},
        lambda context: kernel.record_observation(
            "probe", objective, "repo", status, datetime.now(timezone.utc), class_=class_,
            trace_context=context))


@pytest.mark.rollback
async def test_each_step_joins_the_trace_of_the_open_and_a_retry_links_to_it(
        actors, test_class: str, spans: InMemorySpanExporter) -> None:
    sensor, worker = await actors("sensor"), await actors("worker")
    opened = await _observe(sensor, "traced-1", "red", test_class)
    assert opened.effect == "opened"
    [open_span] = _named(spans, "ledger.open")
    ctx = open_span.context
    assert open_span.parent is None
    assert open_span.attributes[tracing.CAMPAIGN_ID] == opened.campaign_id
    assert open_span.attributes[tracing.VERDICT] == "opened"
    # the database keeps the open's context, and every role can read it
    stored = (await actors.reads("dispatcher")).campaign
    campaign = await stored(opened.campaign_id)
    assert campaign.trace_context == {
        "traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"}

    tracing.use(tracing._provider)  # forget what this process remembered: read it back
    claim = await worker.claim_campaign("w1", [test_class])
    assert claim is not None and claim.attempt_no == 1
    t0 = time.time_ns()
    outcome = await tracing.attempt(worker.executor, claim, _done("attempted"),
                                    claimed=(t0, t0 + 1000), worker="w1")
    assert outcome == "attempted"
    [first] = _named(spans, "ledger.attempt")
    assert first.context.trace_id == ctx.trace_id and first.parent.span_id == ctx.span_id
    assert not first.links
    assert {k: first.attributes[k] for k in (tracing.CAMPAIGN_ID, tracing.CAMPAIGN_CLASS,
                                             tracing.GENERATION, tracing.ATTEMPT_NO)} == {
        tracing.CAMPAIGN_ID: claim.campaign_id, tracing.CAMPAIGN_CLASS: test_class,
        tracing.GENERATION: claim.generation, tracing.ATTEMPT_NO: 1}
    assert first.attributes["ledger.outcome"] == "attempted"
    [claimed] = _named(spans, "ledger.claim")
    assert claimed.parent.span_id == first.context.span_id
    assert (claimed.start_time, claimed.end_time) == (t0, t0 + 1000)

    # a retry: a trace of its own, linked to the open, not nested under it
    retry = Claim.model_validate({**claim.model_dump(by_alias=True), "attempt_no": 2,
                                  "generation": claim.generation + 1})
    await tracing.attempt(worker.executor, retry, _done("failed"))
    second = _named(spans, "ledger.attempt")[1]
    assert second.parent is None and second.context.trace_id != ctx.trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in second.links] == [
        (ctx.trace_id, ctx.span_id)]
    assert second.attributes[tracing.ATTEMPT_NO] == 2

    verdict = await tracing.traced("ledger.verification", worker.executor, claim.campaign_id,
                                   {tracing.ATTEMPT_NO: 1}, _done("accepted"))
    assert verdict == "accepted"
    [verification] = _named(spans, "ledger.verification")
    assert verification.parent.span_id == ctx.span_id
    assert verification.attributes[tracing.VERDICT] == "accepted"

    async def nothing() -> None:
        return None

    await tracing.traced("ledger.side_effect", worker.executor, claim.campaign_id, {}, nothing())
    [effect] = _named(spans, "ledger.side_effect")
    assert effect.parent.span_id == ctx.span_id and tracing.VERDICT not in (effect.attributes or {})

    # a later observation of the open objective is a child of the open too
    await _observe(sensor, "traced-1", "red", test_class)
    [seen] = _named(spans, "ledger.observation")
    assert seen.parent.span_id == ctx.span_id and seen.context.trace_id == ctx.trace_id
    assert seen.attributes[tracing.CAMPAIGN_ID] == opened.campaign_id


async def _done(value: str) -> str:
    return value


@pytest.mark.rollback
async def test_off_nothing_is_recorded_or_stored(actors, test_class: str) -> None:
    assert not tracing.enabled()
    sensor = await actors("sensor")
    result = await _observe(sensor, "untraced-1", "red", test_class)
    assert result.effect == "opened"
    campaign = await (await actors.reads()).campaign(result.campaign_id)
    assert campaign.trace_context is None
    # and the steps' helpers only await the work
    assert await tracing.traced("x", sensor.executor, result.campaign_id, {}, _done("ok")) == "ok"


@pytest.mark.rollback
@pytest.mark.parametrize("context", [
    {"traceparent": "garbage"},
    {"traceparent": "00-" + "0" * 32 + "-" + "1" * 16 + "-01"},   # an invalid (all-zero) trace id
    {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "baggage": "k=v"},
    {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "tracestate": "x" * 513},
    {"tracestate": "k=v"},
])
async def test_the_open_refuses_a_malformed_trace_context(actors, test_class: str,
                                                          context: dict[str, str]) -> None:
    sensor = await actors("sensor")
    with pytest.raises(InvalidInput, match="trace context"):
        await sensor.open_campaign(test_class, "malformed", "repo", trace_context=context)


def test_configured_only_by_the_otel_variables() -> None:
    assert not tracing.wanted({})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "none",
                               "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert not tracing.wanted({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "console"})
    assert not tracing.configure("test", {})
    assert not tracing.enabled()


def test_off_no_opentelemetry_module_is_imported() -> None:
    code = ("import sys; import ledger.roles.sensors, ledger.roles.worker, ledger.roles.verifier, ledger.roles.dispatcher, "
            "ledger.runtime.host, ledger.tracing; "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_no_trace_variable_reaches_an_untrusted_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=secret")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("TRACEPARENT", "00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    for env in (child_environment(), cell_environment()):
        assert not [k for k in env if k.startswith("OTEL_") or k == "TRACEPARENT"]


# --- end to end: four processes, one trace ---------------------------------------


class _Receiver:
    """An OTLP/HTTP trace receiver on loopback: decodes each export request."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 -- http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                receiver.add(self.path, request)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def add(self, path: str, request: ExportTraceServiceRequest) -> None:
        assert path == "/v1/traces"
        found = []
        for rs in request.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
            for ss in rs.scope_spans:
                for s in ss.spans:
                    found.append({
                        "service": service, "name": s.name, "trace": s.trace_id.hex(),
                        "span": s.span_id.hex(), "parent": s.parent_span_id.hex() or None,
                        "links": [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                        "attributes": {a.key: _value(a.value) for a in s.attributes}})
        with self.lock:
            self.spans.extend(found)

    def named(self, name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class _Traced(Drill):
    name = "traced"
    summary = "a regression closed by four processes -> one trace"


@pytest.mark.cells
async def test_one_trace_across_a_sensor_a_worker_a_verifier_and_a_dispatcher(
        db: Database, tmp_path: Path) -> None:
    from ledger.drills.workshop import CLASS, WORKER_ARGS, content_check, setup

    receiver = _Receiver()
    ctx = DrillContext(_Traced(), db, tmp_path, Console(quiet=True), 1.0)
    try:
        check_main = [drill_python(), "-c", "import pathlib, sys; p = pathlib.Path('fix.txt'); "
                      "sys.exit(0 if p.exists() and p.read_text() == 'good' else 1)"]
        sensor = (f"\n[sensors.main]\ntarget = \"repo#main\"\nevery_s = 1.0\nclass = \"{CLASS}\"\n"
                  f"command = {json.dumps(check_main)}\n")
        # attempt 1 fails, attempt 2 fixes it: the retry's span links to the open
        await setup(ctx, {"1": [["environment", "env"], ["exit", 1]],
                          "default": [["write", "fix.txt", "good"], ["exit", 0]]},
                    lease_s=20.0, heartbeat_s=1.0, promote=True,
                    acceptance=[content_check("fix.txt", "good")], sensor=sensor)
        otel = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "100", "TRACEPARENT": "00-" + "e" * 32 + "-" + "f" * 16 + "-01"}
        procs = [ctx.spawn("sensor", "sensor", "run", **otel),
                 ctx.spawn("worker", *WORKER_ARGS, **otel),
                 ctx.spawn("verifier", "verifier", "--poll", "0.5", **otel),
                 ctx.spawn("dispatcher", "dispatcher", "--poll", "0.5", **otel)]
        opened = await ctx.until(lambda: ctx.sql("SELECT id FROM ledger.campaign"), "the open", timeout=60)
        assert opened, _logs(ctx)
        [cid] = [r["id"] for r in ctx.sql("SELECT id FROM ledger.campaign")]
        closed = await ctx.until(lambda: ctx.state(cid) == "confirmed", "the loop to close",
                                 timeout=120, interval=0.25)
        assert closed, f"campaign {cid} is {ctx.state(cid)}\n" + _logs(ctx)
        # every step's span arrives (each process exports every 100 ms)
        wanted = ("ledger.open", "ledger.claim", "ledger.attempt", "ledger.verification",
                  "ledger.promotion")
        arrived = await ctx.until(
            lambda: all(receiver.named(n) for n in wanted) and len(receiver.named("ledger.attempt")) == 2
            and len(receiver.named("ledger.claim")) == 2 and any(
                s["attributes"].get(tracing.VERDICT) == "confirmed"
                for s in receiver.named("ledger.observation")), "the spans", timeout=60)
        assert arrived, json.dumps(receiver.spans, indent=1)
        for p in procs:
            p.signal(signal.SIGTERM)
        assert all(p.wait(30) == 0 for p in procs), _logs(ctx)
        [stored] = ctx.sql("SELECT trace_context FROM ledger.campaign WHERE id = %s", cid)
        attempt_env = json.loads(next(ctx.markers.glob("env-*.json")).read_text())
    finally:
        await ctx.close()
        receiver.close()

    [open_span] = receiver.named("ledger.open")
    trace, root = open_span["trace"], open_span["span"]
    # the context the database kept is the open's, not the sensor's inherited TRACEPARENT
    assert set(stored["trace_context"]) == {"traceparent"}
    assert stored["trace_context"]["traceparent"][:-3] == f"00-{trace}-{root}"
    assert open_span["parent"] is None and open_span["service"] == "ledger-sensor"
    attempt, retry = sorted(receiver.named("ledger.attempt"),
                            key=lambda s: s["attributes"][tracing.ATTEMPT_NO])
    claims = {c["parent"]: c for c in receiver.named("ledger.claim")}
    claim, retry_claim = claims[attempt["span"]], claims[retry["span"]]
    verifications = receiver.named("ledger.verification")
    [effect] = receiver.named("ledger.promotion")
    confirming = [s for s in receiver.named("ledger.observation")
                  if s["attributes"].get(tracing.VERDICT) == "confirmed"]
    in_campaign = [open_span, attempt, claim, *verifications, effect, *confirming]
    assert {s["trace"] for s in in_campaign} == {trace}
    assert {s["service"] for s in in_campaign} == {
        "ledger-sensor", "ledger-worker", "ledger-verifier", "ledger-dispatcher"}
    # the first attempt, each verification, the promotion and the confirming
    # observation are children of the open; the claim is the attempt's
    for span in (attempt, *verifications, effect, *confirming):
        assert span["parent"] == root, span
        assert span["attributes"][tracing.CAMPAIGN_ID] == cid
    assert claim["trace"] == trace
    assert attempt["service"] == "ledger-worker" and not attempt["links"]
    assert attempt["attributes"][tracing.ATTEMPT_NO] == 1
    assert attempt["attributes"][tracing.CAMPAIGN_CLASS] == CLASS
    assert attempt["attributes"][tracing.GENERATION] == 1
    assert attempt["attributes"]["ledger.outcome"] == "failed"
    # the retry: not nested, a trace of its own linked to the open
    assert retry["parent"] is None and retry["trace"] != trace
    assert retry["links"] == [(trace, root)]
    assert retry_claim["trace"] == retry["trace"]
    assert {k: retry["attributes"][k] for k in (tracing.CAMPAIGN_ID, tracing.ATTEMPT_NO,
                                                tracing.GENERATION, "ledger.outcome")} == {
        tracing.CAMPAIGN_ID: cid, tracing.ATTEMPT_NO: 2, tracing.GENERATION: 2,
        "ledger.outcome": "attempted"}
    assert {v["attributes"][tracing.VERDICT] for v in verifications} == {"accepted"}
    assert all(v["service"] == "ledger-verifier" and v["attributes"][tracing.ATTEMPT_NO] == 2
               for v in verifications)
    assert effect["service"] == "ledger-dispatcher"
    assert effect["attributes"]["ledger.side_effect.purpose"] == "promotion"
    assert effect["attributes"]["ledger.side_effect.kind"] == "git.update_ref"
    assert effect["attributes"][tracing.VERDICT] == "done"
    assert open_span["attributes"][tracing.CAMPAIGN_CLASS] == CLASS
    # nothing of tracing reached the attempt's cell
    assert not [k for k in attempt_env if k.startswith("OTEL_") or k == "TRACEPARENT"], attempt_env


def _logs(ctx: DrillContext) -> str:
    return "\n".join(f"--- {p.name}\n{p.log.read_text()[-3000:]}" for p in ctx.procs)
