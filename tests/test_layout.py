"""The package's layout: subpackages by role and layer, and no import upwards.

``src/ledger`` is layered: the database layer (``db``), Ledger's own git
(``git``), the cell (``sandbox``), the roles built on them (``roles``), the
surfaces (``api``, ``cli``, ``mcp_server``) and the operations tooling drills
are built on (``ops``). The drills themselves (``drills/``) and the benchmarks
sit above the library; the library finds drills through the ``ledger.drills``
entry point, never by importing them.
"""

from __future__ import annotations

import ast
from importlib.metadata import entry_points
from pathlib import Path

import ledger

SRC = Path(ledger.__file__).parent

#: Modules that stay at the top of the package: shared by every layer (errors,
#: settings, configuration, identity, logging, the state machine, the attempt
#: protocol) or one entry point each (the demo, reports, tails, bulk actions,
#: the MCP server).
TOP_LEVEL = {"__init__", "__main__", "backoff", "bulk", "config", "demo", "errors", "identity",
             "interface", "release",
             "logs", "machine", "mcp_server", "protocol", "report", "settings", "tail",
             "tracing"}
SUBPACKAGES = {"api", "cli", "db", "git", "ops", "roles", "runtime", "sandbox"}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_no_module_of_the_library_imports_the_drills_or_the_benchmarks() -> None:
    offenders = {
        str(path.relative_to(SRC)): sorted(m for m in _imports(path)
                                           if m.split(".")[0] in {"bench", "tests"}
                                           or m == "ledger.drills" or m.startswith("ledger.drills."))
        for path in SRC.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_modules_live_in_subpackages_by_role_and_layer() -> None:
    top = {p.stem for p in SRC.glob("*.py")}
    assert top <= TOP_LEVEL, f"new top-level modules: {sorted(top - TOP_LEVEL)}"
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    assert packages == SUBPACKAGES


def test_the_layers_below_the_roles_do_not_import_the_roles_or_the_surfaces() -> None:
    upward = {"ledger.roles", "ledger.api", "ledger.cli", "ledger.mcp_server", "ledger.demo"}
    offenders = {
        str(path.relative_to(SRC)): sorted(m for m in _imports(path)
                                           if any(m == u or m.startswith(u + ".") for u in upward))
        for layer in ("db", "git", "sandbox", "ops") for path in (SRC / layer).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_drills_are_found_through_their_entry_point() -> None:
    from ledger.ops.drill import load_drills

    points = [p for p in entry_points(group="ledger.drills")]
    assert [p.value for p in points] == ["ledger.drills:ALL"]
    drills = load_drills()
    assert "hostile-agent" in drills and "chaos" in drills
