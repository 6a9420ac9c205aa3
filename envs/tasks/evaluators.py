"""Which of a task's metrics and getters exist: OSWorld's (the `desktop-env` package) or ours.

OSWorld resolves `evaluator.func` as an attribute of `desktop_env.evaluators.metrics`, and each
getter config (`result`, `expected`) as `get_<type>` of `desktop_env.evaluators.getters`
(desktop_env/desktop_env.py, `_set_evaluator_info`); `func: infeasible` needs neither. Importing
those packages imports every metric's dependencies (OCR, audio, browser automation, pins that
conflict with this project's torch), so the names are read from the two packages' `__init__.py`
without importing them; setup installs `desktop-env` without its dependencies for that.

A task set is checked at freeze (`envs/tasks/osworld.py`), so that a task no verifier can score
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
        ev = task.get("evaluator") or {}
        func = ev.get("func")
        names = func if isinstance(func, list) else [func]
        gaps = [
            f"metric {name!r}"
            for name in names
            if name != INFEASIBLE and name not in self.metrics and name not in CHECKERS
        ]
        for key in ("result", "expected"):
            value = ev.get(key)
            for getter in value if isinstance(value, list) else [value]:
                kind = getter.get("type") if isinstance(getter, Mapping) else None
                if kind is not None and kind not in self.getters:
                    gaps.append(f"{key} getter {kind!r}")
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
    ev = task.get("evaluator") or {}
    func = ev.get("func")
    own = all(name in CHECKERS for name in (func if isinstance(func, list) else [func]))
    if own and not any(ev.get(key) for key in ("result", "expected")):
        return []
    reg = registry()
    where = f"in desktop-env {reg.version} or this project's checkers"
    return [f"{gap} {where}" for gap in reg.missing(task)]
