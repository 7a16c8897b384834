"""What any role may store: bounds on documents, instants and numbers in text.

A value a role writes is read back by every other role (the board, a
campaign's page, the API's lists), so what one sensor token stores must never
be something the readers cannot render. The database enforces the same bounds
with CHECK constraints (``ledger.json_within`` in ``campaign.sql``, the
observation's instant window in ``observation.sql``): what the API refuses no
other path can store. The API checks first, so a refusal names the field.

- A JSON document nests at most ``JSON_MAX_DEPTH`` levels (``{"a": 1}`` is one
  level: the level of its deepest value, as ``jsonb_path_exists(j, 'strict
  $.**{N}')`` counts) and takes at most ``JSON_MAX_BYTES`` as PostgreSQL
  prints it (``jsonb::text``; Python's ``json.dumps`` prints the same
  separators).
- An instant a client gives lies in ``[EARLIEST, LATEST)``: Python's datetime
  cannot hold a BC instant (``0001-01-01T00:00:00+14:00`` is one in UTC), and
  nothing Ledger observes happened before 2000.
- A number in text is ASCII decimal digits only: ``str.isdigit()`` accepts
  ``'²'``, which ``int()`` then refuses.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

from ledger.errors import InvalidInput

#: Deepest level a stored document may have (the SQL CHECKs say the same).
JSON_MAX_DEPTH = 32
#: Largest stored document, in bytes of its text (the SQL CHECKs say the same).
JSON_MAX_BYTES = 256 * 1024
#: The window of instants a client may give (the SQL CHECKs say the same).
EARLIEST = datetime(2000, 1, 1, tzinfo=timezone.utc)
LATEST = datetime(2200, 1, 1, tzinfo=timezone.utc)

_ASCII_DECIMAL = re.compile(r"[0-9]{1,19}")


def json_depth(value: Any) -> int:
    """The level of ``value``'s deepest element (0 for a scalar or an empty
    container), without recursion: a hostile document cannot exhaust the stack."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, level = pending.pop()
        children = item.values() if isinstance(item, dict) else \
            item if isinstance(item, list) else ()
        for child in children:
            deepest = max(deepest, level + 1)
            if isinstance(child, (dict, list)):
                pending.append((child, level + 1))
    return deepest


def check_document(field: str, value: Any, *, max_depth: int = JSON_MAX_DEPTH,
                   max_bytes: int = JSON_MAX_BYTES) -> Any:
    """``value`` if it is within the bounds; ``InvalidInput`` naming ``field`` if not."""
    depth = json_depth(value)
    if depth > max_depth:
        raise InvalidInput(f"{field}: nests {depth} levels deep; at most {max_depth}")
    try:
        size = len(json.dumps(value, ensure_ascii=False, allow_nan=False).encode())
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"{field}: not a JSON document ({exc})") from exc
    if size > max_bytes:
        raise InvalidInput(f"{field}: {size} bytes of JSON; at most {max_bytes}")
    return value


def check_instant(field: str, value: datetime | None) -> datetime | None:
    """``value`` if it lies in the window of instants; ``InvalidInput`` naming ``field``."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise InvalidInput(f"{field}: an instant needs a time zone")
    # Compared as offsets from the window's start: no conversion can overflow.
    if not EARLIEST <= value < LATEST:
        raise InvalidInput(f"{field}: {value.isoformat()} is outside "
                           f"{EARLIEST.date().isoformat()} to {LATEST.date().isoformat()}")
    return value


def ascii_int(text: str | None, field: str, low: int, high: int) -> int:
    """``text`` as a whole number in ``[low, high]``: ASCII digits only (no sign,
    no ``'²'``, no other script's digits); ``InvalidInput`` naming ``field``."""
    stripped = (text or "").strip()
    if not _ASCII_DECIMAL.fullmatch(stripped):
        raise InvalidInput(f"{field}: a whole number from {low} to {high} in ASCII digits")
    number = int(stripped)
    if not low <= number <= high:
        raise InvalidInput(f"{field}: a whole number from {low} to {high}")
    return number


def is_ascii_int(text: str) -> bool:
    """Whether ``text`` is 1-19 ASCII decimal digits (what ``ascii_int`` accepts)."""
    return bool(_ASCII_DECIMAL.fullmatch(text))
