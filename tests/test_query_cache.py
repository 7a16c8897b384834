"""The compiled reads come from a cache when it is current, so a short command
does not import SQLAlchemy; the cache always equals what ``ledger.queries``
compiles, and a damaged one is ignored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ledger import queries, query_cache


def test_the_cache_equals_the_compiled_queries(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_CACHE_DIR", str(tmp_path))
    compiled = query_cache.load()
    (cache,) = tmp_path.glob("queries-*.json")
    cached = query_cache.load()
    assert vars(cached) == vars(compiled)
    assert "CAMPAIGNS_PAGE" in vars(cached) and "LIST_DEFAULTS" in vars(cached)
    for name, value in vars(cached).items():
        assert getattr(queries, name) == value, name
    cache.write_text("{ damaged")
    assert vars(query_cache.load()) == vars(compiled)


def test_a_read_does_not_import_sqlalchemy_once_cached(tmp_path: Path) -> None:
    env = {**os.environ, "LEDGER_CACHE_DIR": str(tmp_path)}
    probe = "import sys, ledger.reads, ledger.cli; print('sqlalchemy' in sys.modules)"
    first = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                           text=True, check=True, timeout=60)
    again = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                           text=True, check=True, timeout=60)
    assert first.stdout.strip() == "True" and again.stdout.strip() == "False"
