"""The analysis modules import one another in one direction only, and read the pre-registration
as the typed object, not through the config's old Target."""

from __future__ import annotations

import ast
from pathlib import Path

ANALYSIS = Path(__file__).resolve().parent.parent / "analysis"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            # `from analysis import figures` imports the module analysis.figures
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def analysis_graph() -> dict[str, set[str]]:
    modules = {f"analysis.{p.stem}": p for p in ANALYSIS.glob("*.py") if p.stem != "__init__"}
    return {name: imported_modules(path) & set(modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        for imported in sorted(graph[module]):
            cycle = visit(imported, [*path, module])
            if cycle:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [])
        if cycle:
            return cycle
    return None


def test_find_cycle_finds_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_analysis_modules_have_no_import_cycle():
    graph = analysis_graph()
    assert {"analysis.outcome", "analysis.figures", "analysis.runs"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_run_loader_is_imported_from_runs():
    graph = analysis_graph()
    for module in ("analysis.outcome", "analysis.figures", "analysis.run_table"):
        assert "analysis.runs" in graph[module], module
    assert graph["analysis.runs"] == set()  # the loader depends on no other analysis module


def test_analysis_reads_no_config_target():
    for path in ANALYSIS.glob("*.py"):
        assert "envab.config.Target" not in imported_modules(path), path.name
