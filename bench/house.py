"""The house's numbers for a checkout, before and after a redesign (issue 56's "must show").

    .venv/bin/python bench/house.py [--root DIR]      # DIR: a checkout, e.g. a git worktree

Inside envs/: its rooms (a top-level module or sub-package), the imports between rooms, the
loops between rooms, and the imports that reach a room on a floor beside or above their own
(tests/test_structure.py's ENV_FLOORS, as this checkout has them; a room it does not know is left
out); then the five longest files and functions, the JSON strings the rules put on shell lines,
the `json.loads(args.…)` calls, and the untyped reads of a run's pins and of a task.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "tests"))
import test_structure as structure  # noqa: E402

STAGES = ("envab", "envs", "trainer", "eval", "analysis")


def room(module: str) -> str | None:
    return module.split(".")[1] if module.startswith("envs.") else None


def floor(name: str) -> int | None:
    return next((i for i, rooms in enumerate(structure.ENV_FLOORS) if name in rooms), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=str(HERE), help="the checkout to read (default this)")
    root = Path(parser.parse_args().root).resolve()
    structure.REPO = root
    known = structure.modules()
    graph = {
        n: {
            c
            for i in structure.project_imports(p)
            if (c := structure.canonical(i, known)) and c != n
        }
        for n, p in known.items()
    }
    edges: dict[tuple[str, str], int] = {}
    upward = []
    for name, imported in graph.items():
        for other in imported:
            a, b = room(name), room(other)
            if a and b and a != b:
                edges[(a, b)] = edges.get((a, b), 0) + 1
                if None not in (floor(a), floor(b)) and floor(b) >= floor(a):
                    upward.append(f"{name} -> {other}")
    rooms = {r for pair in edges for r in pair}
    room_graph = {r: {b for a, b in edges if a == r} for r in rooms}
    loops = structure.find_cycles(room_graph)
    print(f"envs rooms {len(rooms)}; imports between rooms {sum(edges.values())} over "
          f"{len(edges)} pairs; loops {len(loops)}; beside or above {len(upward)}")  # fmt: skip
    for line in [*loops, *sorted(upward)]:
        print(f"    {line}")
    files, functions = [], []
    for stage in STAGES:
        for path in (root / stage).rglob("*.py"):
            text = path.read_text()
            files.append((len(text.splitlines()), path.relative_to(root).as_posix()))
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    where = f"{path.relative_to(root).as_posix()}:{node.name}"
                    functions.append((node.end_lineno - node.lineno + 1, where))
    print("longest files:", ", ".join(f"{p} {n}" for n, p in sorted(files, reverse=True)[:5]))
    print(
        "longest functions:", ", ".join(f"{p} {n}" for n, p in sorted(functions, reverse=True)[:5])
    )
    rules = "".join(p.read_text() for p in (root / "rules").glob("*.smk"))
    code = "".join(p.read_text() for s in STAGES for p in (root / s).rglob("*.py"))
    counts = {
        "JSON strings on shell lines": len(re.findall(r"as_arg[(]|json[.]dumps[(]", rules)),
        "json.loads(args.…)": len(re.findall(r"json[.]loads[(]args[.]", code)),
        "pins[…] reads": len(re.findall(r'pins\["', code)),
        "task[…] reads": len(re.findall(r'task\["', code)),
    }
    print("; ".join(f"{k}: {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
