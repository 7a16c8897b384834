"""List cursors, shared by the HTTP API and ``ledger list``: an opaque token
for the position after a campaign in list order (``updated_at DESC, id DESC``),
so a cursor from one surface continues a listing on the other."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime

from ledger.errors import InvalidInput

BIGINT_MAX = 2**63 - 1


def encode_position(updated_at: datetime, campaign_id: int) -> str:
    """The cursor after the campaign ``(updated_at, campaign_id)``."""
    raw = json.dumps([updated_at.isoformat(), campaign_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    """The ``(updated_at, id)`` position a cursor stands for; ``InvalidInput`` if forged."""
    if len(cursor) > 200:
        raise InvalidInput("the cursor is not one this server issued")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stamp, ident = json.loads(raw)
        when = datetime.fromisoformat(stamp)
        if when.tzinfo is None or not isinstance(ident, int) or not 0 < ident <= BIGINT_MAX:
            raise ValueError("out of range")
        return when, ident
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInput("the cursor is not one this server issued") from exc
