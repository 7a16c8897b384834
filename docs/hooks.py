"""MkDocs hook (``mkdocs.yml``: ``hooks``): adds the reference pages that
``docs/gen.py`` generates from the code, so the site never shows a stale one."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

from mkdocs.structure.files import File, Files


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ledger_docs_gen", Path(__file__).with_name("gen.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_files(files: Files, config: Any) -> Files:
    for path, text in _generator().pages().items():
        files.append(File.generated(config, path, content=text))
    return files
