"""Which of a task's metrics and getters exist: OSWorld's (the `desktop-env` package) or ours.

OSWorld resolves `evaluator.func` as an attribute of `desktop_env.evaluators.metrics`, and each
getter config (`result`, `expected`) as `get_<type>` of `desktop_env.evaluators.getters`
(desktop_env/desktop_env.py, `_set_evaluator_info`); `func: infeasible` needs neither. Importing
those packages imports every metric's dependencies (OCR, audio, browser automation, pins that
conflict with this project's torch), so the names are read from the two packages' `__init__.py`
without importing them; setup installs `desktop-env` without its dependencies for that.

A task set is checked at freeze (`envs/osworld/source.py`), so that a task no verifier can score
is refused before training, not at step 500. The project's own checkers (envs/tasks/checkers.py)
count as metrics too: they read the desktop's whole state and need no getter.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import metadata

from envab.envs.tasks.checkers import CHECKERS
from envab.errors import Refusal

DISTRIBUTION = "desktop-env"
INFEASIBLE = "infeasible"  # OSWorld's metric-less verdict: 1 when the agent answered FAIL


class EvaluatorsMissing(Refusal, RuntimeError):
    """desktop-env is not installed, so OSWorld's metric and getter names cannot be read."""


@dataclass(frozen=True)
class Registry:
    version: str
    metrics: frozenset[str]
    getters: frozenset[str]  # getter types, without the get_ prefix
    modules: Mapping[tuple[str, str], str]  # ("metrics" | "getters", function) -> its module

    def missing(self, task: Mapping) -> list[str]:
        """What `task`'s evaluator names that nothing here provides, as readable items."""
        return [text for _, text in self.missing_named(task)]

    def missing_named(self, task: Mapping) -> list[tuple[str, str]]:
        """`missing`, each item with its reason's name (`unknown:metric:<name>`,
        `unknown:getter:<type>`), which the freeze's per-task report counts."""
        ev = task.get("evaluator") or {}
        func = ev.get("func")
        names = func if isinstance(func, list) else [func]
        gaps = [
            (f"unknown:metric:{name}", f"metric {name!r}")
            for name in names
            if name != INFEASIBLE and name not in self.metrics and name not in CHECKERS
        ]
        for key in ("result", "expected"):
            value = ev.get(key)
            for getter in value if isinstance(value, list) else [value]:
                kind = getter.get("type") if isinstance(getter, Mapping) else None
                if kind is not None and kind not in self.getters:
                    gaps.append((f"unknown:getter:{kind}", f"{key} getter {kind!r}"))
        return gaps


def _exported(source: str) -> dict[str, str]:
    """The names a package's __init__ imports from its modules (`from .x import a, b as c`),
    each with the module it comes from."""
    names = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            names.update({alias.asname or alias.name: node.module for alias in node.names})
    return names


@cache
def registry() -> Registry:
    """desktop-env's metric and getter names; EvaluatorsMissing (one line) when not installed."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise EvaluatorsMissing(
            "desktop-env is not installed, so OSWorld's metrics and getters cannot be checked: "
            "pip install --no-deps desktop-env (setup does)"
        ) from None
    read = lambda package: dist.locate_file(  # noqa: E731
        f"desktop_env/evaluators/{package}/__init__.py"
    ).read_text()
    metrics, getters = _exported(read("metrics")), _exported(read("getters"))
    return Registry(
        dist.version,
        frozenset(metrics),
        frozenset(n.removeprefix("get_") for n in getters if n.startswith("get_")),
        {**{("metrics", n): m for n, m in metrics.items()},
         **{("getters", n): m for n, m in getters.items()}},
    )  # fmt: skip


def missing_evaluators(task: Mapping) -> list[str]:
    """What `task` names that no verifier here provides, each with where it was looked for;
    desktop-env is read only when a task names something beyond this project's checkers."""
    return [text for _, text in missing_named(task)]


def missing_named(task: Mapping) -> list[tuple[str, str]]:
    """`missing_evaluators`, each item with its reason's name (Registry.missing_named)."""
    ev = task.get("evaluator") or {}
    func = ev.get("func")
    own = all(name in CHECKERS for name in (func if isinstance(func, list) else [func]))
    if own and not any(ev.get(key) for key in ("result", "expected")):
        return []
    reg = registry()
    where = f"in desktop-env {reg.version} or this project's checkers"
    return [(name, f"{gap} {where}") for name, gap in reg.missing_named(task)]


# --- what a task may not make the host do -------------------------------------------------------
# A task file is untrusted, and so is the state its metric reads back from the environment. A
# metric or getter whose code evaluates, executes or imports text, or starts processes, would run
# what the environment (where the agent types as root) wrote, on the training host: such a
# function is refused at freeze. Found by reading its source (the function and what it calls in
# its own module), never by importing it.
_RUNS_TEXT = {"eval", "exec", "compile", "__import__", "execfile"}
_RUNS_VIA = {
    "os": {"system", "popen", "execv", "execve", "execvp", "spawnv", "spawnl"},
    "subprocess": None,  # any of it
    "importlib": None,
    "importlib.util": None,
    "runpy": None,
    "pickle": {"load", "loads"},
    "marshal": {"load", "loads"},
    "shelve": None,
    "ctypes": None,
}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _runs_code(call: ast.Call) -> str | None:
    name = _dotted(call.func)
    if name is None:
        return None
    if name in _RUNS_TEXT or name.rsplit(".", 1)[-1] in ("exec_module", "spec_from_file_location"):
        return name
    module, _, attr = name.rpartition(".")
    if module in _RUNS_VIA and (_RUNS_VIA[module] is None or attr in _RUNS_VIA[module]):
        return name
    return None


@cache
def _module_functions(package: str, module: str) -> dict[str, ast.FunctionDef]:
    dist = metadata.distribution(DISTRIBUTION)
    source = dist.locate_file(f"desktop_env/evaluators/{package}/{module}.py").read_text()
    return {
        node.name: node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def runs_code(package: str, function: str) -> str | None:
    """The first call in desktop-env's `function` (or a function of its module it calls) that
    evaluates, executes or imports text or starts a process, e.g. "eval"; None if there is none."""
    module = registry().modules.get((package, function))
    if module is None:
        return None
    functions = _module_functions(package, module)
    seen, todo = set(), [function]
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        for node in ast.walk(functions[name]):
            if isinstance(node, ast.Call):
                found = _runs_code(node)
                if found:
                    return found
                callee = _dotted(node.func)
                if callee in functions:
                    todo.append(callee)
    return None


def _getters(evaluator: Mapping) -> list[tuple[str, Mapping]]:
    out = []
    for key in ("result", "expected"):
        value = evaluator.get(key)
        for i, getter in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(getter, Mapping):
                out.append(
                    (f"evaluator.{key}" + (f"[{i}]" if isinstance(value, list) else ""), getter)
                )
    return out


def bare_file_name(name) -> bool:
    """A file name with no folder in it: what a getter's `dest` (its file in the host's cache
    folder) must be, or it writes outside the cache."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
    )


def _bare_dest(dest) -> bool:
    """A getter's `dest`: a bare file name, or (a getter fetching several files, OSWorld's
    `multi: true`) a non-empty list of them."""
    if isinstance(dest, list):
        return bool(dest) and all(bare_file_name(name) for name in dest)
    return bare_file_name(dest)


def unsafe_evaluators(task: Mapping) -> list[str]:
    """What in `task`'s evaluator would let the task or its environment act on the host: a
    getter `dest` that is not a bare file name, and a metric or getter whose code runs text."""
    return [text for _, text in unsafe_named(task)]


def unsafe_named(task: Mapping) -> list[tuple[str, str]]:
    """`unsafe_evaluators`, each item with its reason's name (`unsafe:dest`,
    `unsafe:metric:<name>`, `unsafe:getter:<type>`): such a task is refused at freeze, or left
    out by a registered rule and reported, and is never runnable on any world."""
    ev = task.get("evaluator") or {}
    problems = []
    for where, getter in _getters(ev):
        if "dest" in getter and not _bare_dest(getter["dest"]):
            problems.append(
                ("unsafe:dest", f"{where}.dest {getter['dest']!r} is not a bare file name")
            )
    own = {name for name in CHECKERS}
    func = ev.get("func")
    metrics = [m for m in (func if isinstance(func, list) else [func]) if isinstance(m, str)]
    if all(m in own or m == INFEASIBLE for m in metrics) and not _getters(ev):
        return problems
    for metric in metrics:
        if metric not in own and (found := runs_code("metrics", metric)):
            problems.append(
                (f"unsafe:metric:{metric}", f"metric {metric!r} runs code on the host ({found})")
            )
    for where, getter in _getters(ev):
        kind = getter.get("type")
        if isinstance(kind, str) and (found := runs_code("getters", f"get_{kind}")):
            problems.append(
                (
                    f"unsafe:getter:{kind}",
                    f"{where} getter {kind!r} runs code on the host ({found})",
                )
            )
    return problems
