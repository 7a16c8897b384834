"""OpenTelemetry spans for the loop's steps, off unless configured.

The design at length: docs/internals.md (``ledger.tracing``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from ledger.errors import LedgerError
from ledger.logs import get_logger

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from ledger.db.database import Executor
    from ledger.db.models import Claim, ObservationRecorded

T = TypeVar("T")

#: The tracer (instrumentation scope) name. Span names and attribute keys are
#: public (dashboards are built on them): each is declared here once, and
#: ``ledger.interface`` lists them (tests/test_interface_names.py holds the two equal).
SCOPE = "ledger"
CAMPAIGN_ID = "ledger.campaign.id"
CAMPAIGN_CLASS = "ledger.campaign.class"
GENERATION = "ledger.campaign.generation"
ATTEMPT_NO = "ledger.attempt.number"
VERDICT = "ledger.verdict"
OUTCOME = "ledger.outcome"
OBJECTIVE_KEY = "ledger.objective_key"
OBSERVATION_STATUS = "ledger.observation.status"
SENSOR = "ledger.sensor"
WORKER = "ledger.worker"
VERIFIER = "ledger.verifier"
VERIFICATION_ID = "ledger.verification.id"
VERIFICATION_KIND = "ledger.verification.kind"
DISPATCHER = "ledger.dispatcher"
SIDE_EFFECT_ID = "ledger.side_effect.id"
SIDE_EFFECT_KIND = "ledger.side_effect.kind"
SIDE_EFFECT_PURPOSE = "ledger.side_effect.purpose"
SIDE_EFFECT_TRIES = "ledger.side_effect.tries"

#: Span names.
OPEN_SPAN = "ledger.open"
OBSERVATION_SPAN = "ledger.observation"
ATTEMPT_SPAN = "ledger.attempt"
CLAIM_SPAN = "ledger.claim"
VERIFICATION_SPAN = "ledger.verification"
PROMOTION_SPAN = "ledger.promotion"
SIDE_EFFECT_SPAN = "ledger.side_effect"

_tracer: Tracer | None = None
_provider: TracerProvider | None = None
#: campaign id -> its trace context (``None``: opened untraced); a context
#: never changes once written, so a process asks the database once.
_contexts: OrderedDict[int, dict[str, str] | None] = OrderedDict()
_CONTEXTS_KEPT = 4096

_log = get_logger("tracing")


def enabled() -> bool:
    """Whether this process records spans."""
    return _tracer is not None


def _otel_environment() -> Mapping[str, str]:
    # The OTEL_* variables are the SDK's own (the OpenTelemetry specification
    # names them), not Ledger's knobs: they are read as the process inherited them.
    from ledger.settings import inherited_environment

    return inherited_environment()


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces."""
    environ = _otel_environment() if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def configure(service: str, environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on for this process if ``environ`` asks for it and the SDK
    is installed; ``service`` is the default ``service.name`` (``ledger-<service>``;
    ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` override it). The
    exporters are ``OTEL_TRACES_EXPORTER``'s (``otlp``: OTLP over HTTP with
    protobuf, configured by the ``OTEL_EXPORTER_OTLP_*`` variables; ``console``).
    Returns whether tracing is on."""
    environ = _otel_environment() if environ is None else environ
    if _tracer is not None or not wanted(environ):
        return _tracer is not None
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        _log.warning("OTEL_* asks for traces, but the OpenTelemetry SDK is not installed "
                     "(pip install 'ledger[otel]'); tracing stays off")
        return False
    names = [n.strip().lower() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    exporters: list[SpanExporter] = []
    for name in names:
        if name == "otlp":
            protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
            if protocol != "http/protobuf":
                _log.warning("only OTLP over http/protobuf is supported; not exporting by otlp",
                             protocol=protocol)
                continue
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name != "none":
            _log.warning("unknown OTEL_TRACES_EXPORTER; ignored", exporter=name)
    if not exporters:
        return False
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES;
    # without a name there, the SDK's placeholder gives way to Ledger's.
    resource = Resource.create({})
    if str(resource.attributes.get(SERVICE_NAME, "unknown_service")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: f"ledger-{service}"}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    use(provider)
    _log.info("tracing on", service=resource.attributes.get(SERVICE_NAME), exporters=names)
    return True


def use(provider: TracerProvider | None) -> None:
    """Record spans through ``provider`` (``None``: off again). ``configure``
    calls it; a test passes a provider with an in-memory exporter."""
    global _tracer, _provider
    _contexts.clear()
    _provider = provider
    _tracer = provider.get_tracer(SCOPE) if provider is not None else None


def shutdown() -> None:
    """Flush and stop the provider ``configure`` installed (at a process's end)."""
    provider = _provider
    use(None)
    if provider is not None:
        provider.shutdown()


# --- trace contexts ------------------------------------------------------------


def carrier(span: Span) -> dict[str, str]:
    """The W3C trace context of ``span``, as a campaign keeps it."""
    from opentelemetry.trace import set_span_in_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    found: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(found, context=set_span_in_context(span))
    return {k: v for k, v in found.items() if k in ("traceparent", "tracestate")}


async def campaign_context(executor: Executor, campaign_id: int) -> dict[str, str] | None:
    """The trace context campaign ``campaign_id`` was opened with (read once
    per process, then remembered); ``None`` if it was opened untraced."""
    if campaign_id in _contexts:
        _contexts.move_to_end(campaign_id)
        return _contexts[campaign_id]
    from ledger.db.reads import Reads

    try:
        found = await Reads(executor).trace_context(campaign_id)
    except LedgerError as exc:
        # Tracing never costs a step: without its context the span starts a
        # trace of its own (the next step asks again).
        _log.warning("could not read the campaign's trace context", campaign=campaign_id,
                     error=exc.message)
        return None
    remember(campaign_id, found)
    return found


def remember(campaign_id: int, context: dict[str, str] | None) -> None:
    """Keep ``context`` as campaign ``campaign_id``'s (it never changes)."""
    _contexts[campaign_id] = context
    _contexts.move_to_end(campaign_id)
    while len(_contexts) > _CONTEXTS_KEPT:
        _contexts.popitem(last=False)


def _parent(context: Mapping[str, str] | None) -> Any:
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract(dict(context)) if context else Context()


def _span_context(context: Mapping[str, str] | None) -> Any:
    from opentelemetry.trace import get_current_span

    return get_current_span(_parent(context)).get_span_context()


# --- the steps -------------------------------------------------------------------


@contextmanager
def step(name: str, context: Mapping[str, str] | None, attributes: Mapping[str, Any], *,
         kind: str = "INTERNAL", linked: bool = False, start_ns: int | None = None) -> Iterator[Span]:
    """A span for one step of a campaign, a child of the campaign's trace
    ``context`` -- or, ``linked``, the root of a trace of its own that links
    to it (a retry). Only call it when ``enabled()``."""
    from opentelemetry.trace import Link, SpanKind

    assert _tracer is not None
    parent = _span_context(context)
    links = [Link(parent)] if linked and parent.is_valid else None
    with _tracer.start_as_current_span(
            name, context=_parent(None if linked else context), kind=SpanKind[kind],
            attributes={k: v for k, v in attributes.items() if v is not None},
            links=links, start_time=start_ns) as span:
        yield span


@contextmanager
def opening(attributes: Mapping[str, Any], *, start_ns: int | None = None
            ) -> Iterator[tuple[Span, dict[str, str]]]:
    """The ``ledger.open`` span (a new trace) and the context to open the
    campaign with. Only call it when ``enabled()``."""
    assert _tracer is not None
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(
            OPEN_SPAN, context=Context(), kind=SpanKind.PRODUCER, start_time=start_ns,
            attributes={k: v for k, v in attributes.items() if v is not None}) as span:
        yield span, carrier(span)


async def observation(executor: Executor, objective_key: str, status: str,
                      attributes: Mapping[str, Any],
                      record: Callable[[dict[str, str] | None], Awaitable[ObservationRecorded]],
                      *, start_ns: int | None = None) -> ObservationRecorded:
    """Record an observation (``record(trace_context)``) inside its span: a
    ``ledger.observation`` child of the open campaign's trace, or -- a red
    observation with no campaign open, which is to open one -- a
    ``ledger.open`` span whose context the new campaign keeps."""
    if _tracer is None:
        return await record(None)
    from ledger.db.reads import Reads

    try:
        found = await Reads(executor).open_trace_context(objective_key)
    except LedgerError as exc:
        _log.warning("could not read the objective's trace context; recording untraced",
                     objective=objective_key, error=exc.message)
        return await record(None)
    said = {OBJECTIVE_KEY: objective_key, OBSERVATION_STATUS: status, **attributes}

    def recorded(span: Span, result: ObservationRecorded) -> None:
        span.set_attribute(VERDICT, result.effect)
        if result.campaign_id is not None:
            span.set_attribute(CAMPAIGN_ID, result.campaign_id)

    if found is None and status == "red":
        with opening(said, start_ns=start_ns) as (span, opened):
            result = await record(opened)
            recorded(span, result)
            if result.effect == "opened" and result.campaign_id is not None:
                remember(result.campaign_id, opened)
            else:  # another sensor opened it a moment ago: this was an observation
                span.update_name(OBSERVATION_SPAN)
            return result
    campaign_id, context = found if found is not None else (None, None)
    with step(OBSERVATION_SPAN, context, {CAMPAIGN_ID: campaign_id, **said},
              start_ns=start_ns) as span:
        result = await record(None)
        recorded(span, result)
        return result


def claim_attributes(claim: Claim) -> dict[str, Any]:
    """The attributes of a claimed campaign's attempt."""
    return {CAMPAIGN_ID: claim.campaign_id, CAMPAIGN_CLASS: claim.class_,
            GENERATION: claim.generation, ATTEMPT_NO: claim.attempt_no,
            OBJECTIVE_KEY: claim.objective_key}


async def attempt(executor: Executor, claim: Claim, work: Awaitable[str], *,
                  claimed: tuple[int, int] | None = None, worker: str | None = None) -> str:
    """Await ``work`` (an attempt, returning its outcome) inside its
    ``ledger.attempt`` span, with the claim (``claimed``: its start and end,
    in ns since the epoch) as a ``ledger.claim`` child. The first attempt is a
    child of the open; a retry (attempt 2 on) links to it instead."""
    if _tracer is None:
        return await work
    context = await campaign_context(executor, claim.campaign_id)
    attributes = {**claim_attributes(claim), WORKER: worker}
    start = claimed[0] if claimed else None
    with step(ATTEMPT_SPAN, context, attributes, kind="CONSUMER",
              linked=claim.attempt_no > 1, start_ns=start) as span:
        if claimed is not None:
            _tracer.start_span(CLAIM_SPAN, attributes=attributes,
                               start_time=claimed[0]).end(end_time=claimed[1])
        outcome = await work
        span.set_attribute(OUTCOME, outcome)
        return outcome


async def traced(name: str, executor: Executor, campaign_id: int, attributes: Mapping[str, Any],
                 work: Awaitable[T], *, verdict: Callable[[T], object] = lambda r: r,
                 context: Mapping[str, str] | None = None, known: bool = False) -> T:
    """Await ``work`` inside span ``name``, a child of campaign
    ``campaign_id``'s trace (``context`` if ``known``, else read), with
    ``verdict(result)`` as its ``ledger.verdict`` (none if ``None``)."""
    if _tracer is None:
        return await work
    if not known:
        context = await campaign_context(executor, campaign_id)
    with step(name, context, {CAMPAIGN_ID: campaign_id, **attributes}) as span:
        result = await work
        if (said := verdict(result)) is not None:
            span.set_attribute(VERDICT, str(said))
        return result


def now_ns() -> int:
    """Wall-clock time in ns, as spans take it (only read when tracing)."""
    return time.time_ns() if _tracer is not None else 0
