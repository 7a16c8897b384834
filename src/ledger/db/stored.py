"""Reading back whatever the database holds, without failing.

The database bounds what a role may store (``ledger.db.bounds``), but rows from
before a bound, or written by the administrator by hand, are read by every
page and route: one unreadable value must not turn a list into a 500 for
everyone. So the values Python reads are made renderable where they are
loaded (psycopg's loaders, for every connection of the process):

- ``jsonb``/``json``: a document Python's parser refuses (nested past the
  interpreter's recursion limit, an integer of more digits than ``int``
  takes) reads as ``{"unrenderable": "<why>"}``; containers deeper than
  ``READ_MAX_DEPTH`` (far above what a role may store, and below where
  pydantic's serializer gives up at ~255 levels) read as a string saying so.
- ``timestamptz``/``date``: an instant Python cannot hold (BC, year 10000 and
  later, ``±infinity``) reads as ``datetime.min``/``max`` (UTC), so it sorts
  and prints where it belongs instead of failing the whole read.
"""

from __future__ import annotations

import json
import struct
from datetime import date, datetime, timezone
from typing import Any

import psycopg
from psycopg import abc
from psycopg.adapt import Buffer, Loader
from psycopg.pq import Format
from psycopg.types.json import set_json_loads

#: Containers nested deeper than this read as a marker (the stored bound is 32).
READ_MAX_DEPTH = 64
EARLIEST_READ = datetime.min.replace(tzinfo=timezone.utc)
LATEST_READ = datetime.max.replace(tzinfo=timezone.utc)


def _deeper_than(value: Any, limit: int) -> Any:
    """``value`` with every container below ``limit`` levels replaced by a marker
    (iterative: a deep document cannot exhaust the stack)."""
    marker = f"(unrenderable: nested deeper than {limit} levels)"
    root = [value]
    pending: list[tuple[Any, int]] = [(root, -1)]
    while pending:
        holder, level = pending.pop()
        keys = list(holder.keys()) if isinstance(holder, dict) else range(len(holder))
        for key in keys:
            child = holder[key]
            if isinstance(child, (dict, list)) and child:
                if level + 1 >= limit:
                    holder[key] = marker
                else:
                    pending.append((child, level + 1))
    return root[0]


def safe_loads(data: bytes | bytearray | memoryview | str) -> Any:
    """``json.loads`` that never fails on what PostgreSQL accepted as JSON."""
    raw = bytes(data) if isinstance(data, (bytearray, memoryview)) else data
    try:
        value = json.loads(raw)
    except (RecursionError, ValueError) as exc:
        return {"unrenderable": f"the stored document cannot be read ({type(exc).__name__})"}
    # A document with no more brackets than the limit cannot be deeper: skip the walk.
    opening = (raw.count(b"{") + raw.count(b"[")) if isinstance(raw, bytes) \
        else (raw.count("{") + raw.count("["))
    if opening > READ_MAX_DEPTH and isinstance(value, (dict, list)):
        value = _deeper_than(value, READ_MAX_DEPTH)
    return value


def _outside(data: Buffer, fmt: Format) -> bool:
    """Whether an out-of-range value is before (True) or after year 1..9999."""
    if fmt == Format.BINARY:
        raw = bytes(data)
        number: int = struct.unpack("!q" if len(raw) == 8 else "!i", raw)[0]
        return number < 0
    text = bytes(data)
    return text.endswith(b"BC") or text.startswith(b"-")


def _tolerant(base: type[abc.Loader], low: Any, high: Any) -> type[Loader]:
    """A loader that delegates to ``base`` (psycopg's own, C where available) and
    reads a value out of Python's range as ``low`` or ``high``."""

    class Tolerant(Loader):
        format = base.format

        def __init__(self, oid: int, context: Any = None):
            super().__init__(oid, context)
            self._inner = base(oid, context)

        def load(self, data: Buffer) -> Any:
            try:
                return self._inner.load(data)
            except psycopg.DataError:
                return low if _outside(data, self.format) else high

    Tolerant.__name__ = f"Tolerant{base.__name__}"
    return Tolerant


def install(adapters: psycopg.adapt.AdaptersMap = psycopg.adapters) -> None:
    """Use the tolerant loaders for every connection made after this (global)."""
    set_json_loads(safe_loads)
    bounds: dict[str, tuple[Any, Any]] = {
        "timestamptz": (EARLIEST_READ, LATEST_READ),
        "timestamp": (datetime.min, datetime.max),
        "date": (date.min, date.max),
    }
    for name, (low, high) in bounds.items():
        info = adapters.types.get(name)
        if info is None:
            continue
        for fmt in (Format.TEXT, Format.BINARY):
            base = adapters.get_loader(info.oid, fmt)
            if base is not None and not base.__name__.startswith("Tolerant"):
                adapters.register_loader(info.oid, _tolerant(base, low, high))
