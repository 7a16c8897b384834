"""The application factory: routes, error handling, middleware, and the lifespan
that owns this process's hub and per-role pools.

``create_app(database, tokens)`` builds an app for tests and embedding;
``app_from_settings()`` builds the one ``ledger serve`` runs (also usable as
``uvicorn --factory ledger.api:app_from_settings``). The operator's dashboard
(``ledger.api.dashboard``) is mounted at ``/ui``.

Maintained libraries do what they do well here: Starlette's
``SessionMiddleware`` (itsdangerous) signs the browser session
(``ledger.api.cookies``), asgi-correlation-id gives every request an id,
fastapi-offline ships the Swagger UI and ReDoc assets that ``/docs`` and
``/redoc`` serve from this server (no CDN: the docs work offline), and
prometheus-client keeps the request-duration histogram, and uvicorn's
proxy-headers middleware takes the client's address and scheme from
``X-Forwarded-For`` and ``X-Forwarded-Proto`` -- from the proxies
``forwarded_allow_ips`` trusts only, so a header any other peer sends is
ignored (it is here, not in ``ledger serve``'s uvicorn configuration, so that
every way of serving the app honours the one setting). The body limit stays
ours (``ledger.api.middleware``): neither Starlette nor uvicorn limits a
request body.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from asgi_correlation_id import CorrelationIdMiddleware
from fastapi import Depends, FastAPI
from fastapi.responses import RedirectResponse
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline
from starlette.middleware.sessions import SessionMiddleware
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from ledger.api import (
    approvals,
    bulk_jobs,
    campaigns,
    classes,
    contract,
    cookies,
    dashboard,
    events,
    health,
    limits,
    metrics,
    observations,
    problems,
)
from ledger.api.auth import TokenTable
from ledger.api.cookies import SecureOverHttps
from ledger.api.middleware import BodyLimit, HtmlHeaders, RequestLog
from ledger.api.roles import RolePools
from ledger.api.state import ApiOptions, ApiState
from ledger.api.throttle import AuthThrottle
from ledger.config import LedgerConfig, load_config
from ledger.db.database import Database
from ledger.db.hub import Hub
from ledger.errors import ConfigError
from ledger.logs import get_logger
from ledger.settings import Settings, get_settings

log = get_logger("api")

#: A client's X-Request-ID is kept if it looks like an id, else replaced.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def create_app(database: Database, tokens: TokenTable,
               options: ApiOptions | None = None, config: LedgerConfig | None = None) -> FastAPI:
    """The HTTP API over ``database``, authenticating with ``tokens``; ``config``
    (``ledger.toml``, if any) gives the dashboard the sensors' schedules."""
    options = options or ApiOptions()
    state = ApiState(database=database, tokens=tokens, options=options,
                     pools=RolePools(database, max_size=options.pool_max_size),
                     throttle=AuthThrottle(options.auth_failures_per_minute,
                                           options.requests_per_minute))
    if options.session_secret:
        state.bulk_key = options.session_secret.encode()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if options.hub:
            # Not waiting for the first LISTEN: the server starts (and says it is
            # not ready) while the database is down; the hub keeps reconnecting.
            state.hub = await Hub(database, actor="reader",
                                  queue_alarm=options.notify_queue_alarm).start(wait=False)
        if not len(tokens):
            log.warning("no API tokens configured (LEDGER_API_TOKENS): every request but "
                        "the probes will be refused")
        try:
            yield
        finally:
            for job in list(state.jobs.values()):
                job.cancel()
            if state.hub is not None:
                await state.hub.stop()
            await state.pools.close()

    app = FastAPIOffline(
        static_url="/docs/assets",
        favicon_url="/ui/static/favicon.svg",
        # Named operations: the route function's name (list_campaigns, ...).
        generate_unique_id_function=_operation_id,
        title="Ledger",
        version="1",
        summary="Durable campaigns for fleets of automation and AI-agent workers",
        description="Every error is `application/problem+json` (RFC 9457) with a stable "
                    "`type`. Authenticate with `Authorization: Bearer <token>`; the token's "
                    "role (reader, operator, sensor) is the database role the request acts as.",
        lifespan=lifespan,
        dependencies=[Depends(contract.refuse_unknown_query)],
    )
    app.state.ledger = state
    problems.install(app)
    for module in (campaigns, approvals, bulk_jobs, classes, limits, events, observations, metrics, health,
                   problems):
        app.include_router(module.router)
    # Mounted, not included: pages are not part of the API's OpenAPI contract.
    app.mount("/ui", dashboard.create_dashboard(state, config))

    @app.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    # Added last = outermost: the request id is there for the log, and the log
    # sees every response, limits included.
    app.add_middleware(BodyLimit, max_bytes=options.max_body_bytes)
    app.add_middleware(SessionMiddleware,
                       secret_key=cookies.session_secret(options.session_secret,
                                                         (e.digest for e in tokens.entries)),
                       session_cookie=cookies.COOKIE, max_age=int(options.session_ttl_s), path="/",
                       same_site="strict", https_only=options.secure_cookies)
    app.add_middleware(SecureOverHttps)  # outside the session middleware: sees its cookie
    app.add_middleware(HtmlHeaders)
    app.add_middleware(RequestLog, counters=state.counters)
    app.add_middleware(CorrelationIdMiddleware, header_name="X-Request-ID",
                       generator=lambda: uuid.uuid4().hex,
                       validator=lambda value: bool(_REQUEST_ID.match(value)))
    if options.forwarded_allow_ips:
        # Outermost: the log, the throttle and the cookie's Secure flag all see
        # the client the trusted proxy names (and its https).
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=list(options.forwarded_allow_ips))
    return app


def _operation_id(route: APIRoute) -> str:
    return route.name


def app_from_settings(settings: Settings | None = None,
                      options: ApiOptions | None = None) -> FastAPI:
    """The app ``ledger serve`` runs: database and tokens from the settings, and
    the config file if there is one (the server runs without it)."""
    settings = settings or get_settings()
    config: LedgerConfig | None = None
    if settings.config.is_file():
        try:
            config = load_config(settings.config)
        except ConfigError as exc:
            log.warning("config not loaded: the dashboard shows no sensor schedules",
                        error=exc.message)
    options = options or ApiOptions.from_settings(settings)
    database = Database.from_settings(settings, service=True)  # says so if it holds admin rights
    return create_app(database, TokenTable.parse(settings.api_tokens),
                      options, config)
