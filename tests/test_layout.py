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
import ledger.verifiers

SRC = Path(ledger.__file__).parent
#: The judge and its plugins: the repository's top-level verifiers/, installed as
#: ledger.verifiers (the in-cell helpers under inside/ are scripts, not modules).
VERIFIERS = Path(ledger.verifiers.__file__).parent

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


def test_the_runtime_imports_neither_the_roles_nor_the_surfaces() -> None:
    upward = {"ledger.roles", "ledger.api", "ledger.cli", "ledger.mcp_server", "ledger.demo"}
    offenders = {
        str(path.relative_to(SRC)): sorted(m for m in _imports(path)
                                           if any(m == u or m.startswith(u + ".") for u in upward))
        for path in (SRC / "runtime").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_roles_depend_on_no_fault_injection_code() -> None:
    """Drills stop a service at its seams (``ledger.runtime.seams``), plugging
    in their own fault points from outside: no role imports the drill tooling."""
    offenders = {
        str(path.relative_to(SRC)): sorted(m for m in _imports(path)
                                           if m == "ledger.ops" or m.startswith("ledger.ops."))
        for path in (SRC / "roles").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_judge_imports_only_the_layers_below_the_roles() -> None:
    """The roles (the verifier, the sensors) import the judge; the judge
    imports the cell and nothing that imports it back."""
    allowed = ("ledger.sandbox", "ledger.errors", "ledger.settings", "ledger.logs",
               "ledger.verifiers", "ledger.git", "ledger.db.documents")
    offenders = {
        str(path.relative_to(VERIFIERS)): sorted(
            m for m in _imports(path) if m.split(".")[0] == "ledger"
            and not any(m == a or m.startswith(a + ".") for a in allowed))
        for path in VERIFIERS.glob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def _module_graph() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports: at the top, inside
    functions and under ``TYPE_CHECKING`` alike (a cycle dodged by importing
    late or for types only is still a cycle of the design)."""
    modules: dict[str, Path] = {}
    for package, folder in (("ledger", SRC), ("ledger.verifiers", VERIFIERS)):
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[0] == "inside":
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(t for a in node.names if (t := resolve(a.name)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    found.add(target if target in modules else resolve(base) or "")
        graph[name] = {t for t in found if t and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    graph = _module_graph()
    assert "ledger.roles.merge_queue" in graph["ledger.roles.dispatcher"]  # the graph sees imports
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_drills_are_found_through_their_entry_point() -> None:
    from ledger.ops.drill import load_drills

    points = [p for p in entry_points(group="ledger.drills")]
    assert [p.value for p in points] == ["ledger.drills:ALL"]
    drills = load_drills()
    assert "hostile-agent" in drills and "chaos" in drills
