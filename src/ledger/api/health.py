"""``/livez`` (the process answers) and ``/readyz`` (the database answers and its
schema is at the revision this code expects). Neither needs a token: load
balancers and orchestrators probe them."""

from __future__ import annotations

import anyio
from fastapi import APIRouter, Request
from pydantic import BaseModel

from .. import migrations
from ..errors import Unavailable
from ..logs import get_logger
from . import problems

log = get_logger("api")

router = APIRouter(tags=["health"])


class Health(BaseModel):
    """A probe's answer."""

    status: str
    revision: str | None = None
    head: str | None = None


@router.get("/livez", response_model=Health)
async def livez() -> Health:
    """The process is up (it does not touch the database)."""
    return Health(status="alive")


@router.get("/readyz", response_model=Health, responses=problems.responses(503))
async def readyz(request: Request) -> Health:
    """The database is reachable and migrated to this code's head (else 503)."""
    api = request.app.state.ledger
    head = migrations.head()
    try:
        # Alembic's read is blocking: a worker thread, abandoned if it hangs.
        with anyio.fail_after(api.options.ready_timeout_s):
            revision = await anyio.to_thread.run_sync(migrations.current, api.database.url,
                                                      abandon_on_cancel=True)
    except TimeoutError as exc:
        raise Unavailable("the database did not answer in time") from exc
    except Exception as exc:  # any failure to read the revision means: not ready
        # The probe is unauthenticated: the cause (hosts, users) goes to the log only.
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()),
                     type(exc).__name__)
        log.warning("not ready", error=first)
        raise Unavailable("the database is not reachable") from exc
    if revision != head:
        raise Unavailable(f"the schema is at {revision or 'no revision'}, this code needs {head}; "
                          "run `ledger migrate`")
    return Health(status="ready", revision=revision, head=head)
