"""The compiled reads of ``ledger.queries``, without importing SQLAlchemy.

``ledger.queries`` builds every read with SQLAlchemy Core and compiles it at
import, which costs a short command (``ledger list``) about a third of a
second. The compiled text changes only when ``queries.py`` or SQLAlchemy does,
so the first process after such a change compiles them and writes them to a
JSON file in the user's cache directory, named by a digest of both; every
later process reads that file instead. Anything unexpected (no cache
directory, a value JSON cannot hold, a damaged file) falls back to importing
``ledger.queries`` itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from .query_text import Query

_HERE = Path(__file__).parent


def _digest() -> str | None:
    """A digest of what the compiled text depends on: queries.py and SQLAlchemy's version."""
    spec = importlib.util.find_spec("sqlalchemy")
    if spec is None or spec.origin is None:
        return None
    h = hashlib.sha256()
    for path in (_HERE / "queries.py", _HERE / "query_text.py", Path(spec.origin)):
        h.update(path.read_bytes())
    return h.hexdigest()[:24]


def _cache_file(digest: str) -> Path:
    from platformdirs import user_cache_dir

    root = os.environ.get("LEDGER_CACHE_DIR") or user_cache_dir("ledger")
    return Path(root) / f"queries-{digest}.json"


def _from_module() -> tuple[SimpleNamespace, dict[str, Any]]:
    from . import queries as module

    # the compiled reads and plain constants (LIST_DEFAULTS), not SQLAlchemy's
    # types that the module also names in capitals (ARRAY, JSONB, TS)
    constants = {name: value for name, value in vars(module).items()
                 if name.isupper() and not name.startswith("_")
                 and isinstance(value, (Query, dict, str, int, float))}
    namespace = SimpleNamespace(**constants)
    encoded: dict[str, Any] = {}
    for name, value in constants.items():
        if isinstance(value, Query):
            encoded[name] = {"text": value.text, "defaults": value.defaults, "query": True}
        else:
            encoded[name] = {"value": value}
    return namespace, encoded


def _decode(encoded: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(**{
        name: Query(item["text"], item["defaults"]) if item.get("query") else item["value"]
        for name, item in encoded.items()})


def load() -> SimpleNamespace:
    """Every constant of ``ledger.queries`` (the compiled ``Query`` objects and
    their defaults), from the cache when it is current."""
    try:
        digest = _digest()
    except OSError:
        digest = None
    if digest is None:
        return _from_module()[0]
    path = _cache_file(digest)
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return _decode(json.loads(path.read_text()))
    namespace, encoded = _from_module()
    with contextlib.suppress(OSError, TypeError, ValueError):
        text = json.dumps(encoded)
        if _decode(json.loads(text)) != namespace:
            return namespace  # something JSON does not round-trip: no cache
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".queries-")
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)  # atomic: a concurrent reader sees all of it or nothing
    return namespace


queries = load()
