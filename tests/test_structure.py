"""The code's shape: stages import only from earlier stages, and no module imports itself back
through another (a cycle), so each stage can be read, changed and tested on its own."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# In the order the data flows: a stage may import from itself and from stages before it.
STAGES = ("envab", "envs", "trainer", "eval", "analysis")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def stage_of(module: str) -> str | None:
    """The stage a module belongs to, under the `envab` namespace or not."""
    parts = module.split(".")
    if parts[0] == "envab" and len(parts) > 1 and parts[1] in STAGES[1:]:
        return parts[1]
    return parts[0] if parts[0] in STAGES else None


def project_imports(path: Path) -> set[str]:
    """The project modules `path` imports (at any depth: a deferred import is still a
    dependency), as dotted names; `from a import b` counts as `a.b` when that is a module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {n for n in names if stage_of(n)}


def modules() -> dict[str, Path]:
    found = {}
    for stage in STAGES:
        for path in sorted((REPO / stage).rglob("*.py")):
            found[module_name(path)] = path
    return found


def canonical(name: str, known: dict[str, Path]) -> str | None:
    """`name` as a module of this repository (its folder path), or None if it is not one."""
    parts = name.split(".")
    if parts[0] == "envab" and len(parts) > 1 and parts[1] in STAGES[1:]:
        parts = parts[1:]
    while parts:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return None


def test_no_stage_imports_a_later_stage():
    known = modules()
    wrong = []
    for name, path in known.items():
        here = STAGES.index(stage_of(name))
        for imported in project_imports(path):
            there = STAGES.index(stage_of(imported))
            if there > here:
                wrong.append(f"{path.relative_to(REPO)} imports {imported}")
    assert not wrong, "an earlier stage imports a later one:\n" + "\n".join(wrong)


# Inside envs/, floors from the ground up (issue 56's order): a room (a top-level module or a
# sub-package of envs/) imports only its own modules and rooms on floors below its own, never one
# beside it or above. The wire and the ground types first; the task factory and what every source
# shares; the VM; the X desktop on the VM; the hosts and OSWorld's source on the X desktop; the
# Drums client of a host; the arms that open any of them; the validator that opens an arm.
ENV_FLOORS = (
    {"protocol", "channel", "desktop", "arm_schema", "faults", "auth", "seccomp", "scratch",
     "placement", "memory"},
    {"tasks", "lifetime", "check", "controls"},
    {"qemu"},
    {"xdesktop"},
    {"host", "osworld"},
    {"drums"},
    {"arms"},
    {"validate"},
)  # fmt: skip


def room_of(module: str) -> str | None:
    """The room of envs/ a module (as `canonical` names it) belongs to; None outside envs/."""
    parts = module.split(".")
    return parts[1] if parts[0] == "envs" and len(parts) > 1 else None


def floor_of(room: str) -> int:
    return next(i for i, rooms in enumerate(ENV_FLOORS) if room in rooms)


def floor_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import inside envs/ that reaches a room beside or above its own."""
    wrong = []
    for name, imported in sorted(graph.items()):
        here = room_of(name)
        for other in sorted(imported):
            there = room_of(other)
            if here and there and there != here and floor_of(there) >= floor_of(here):
                wrong.append(f"{name} (floor {floor_of(here)}) imports {other} "
                             f"(floor {floor_of(there)})")  # fmt: skip
    return wrong


def module_graph() -> dict[str, set[str]]:
    known = modules()
    return {
        name: {c for i in project_imports(path) if (c := canonical(i, known)) and c != name}
        for name, path in known.items()
    }


def test_every_room_of_envs_has_a_floor():
    rooms = {p.stem for p in (REPO / "envs").iterdir() if p.suffix == ".py" or p.is_dir()}
    rooms -= {"__init__", "__pycache__"}
    floored = set().union(*ENV_FLOORS)
    assert rooms == floored, f"without a floor: {sorted(rooms - floored)}; " \
        f"gone: {sorted(floored - rooms)}"  # fmt: skip


def test_envs_rooms_import_only_floors_below():
    wrong = floor_violations(module_graph())
    assert not wrong, "a room of envs/ imports one beside or above it:\n" + "\n".join(wrong)


def test_the_floors_see_a_violation():
    """The rule itself can fail: the X desktop reaching up into the host, and two rooms of one
    floor reaching across, are named; a room's own modules and a floor below are not."""
    graph = {
        "envs.xdesktop.qemu": {"envs.host.gvisor", "envs.qemu.vm", "envs.xdesktop.image"},
        "envs.qemu.pool": {"envs.tasks.checkers", "envs.protocol"},
        "envs.tasks.build": {"envs.lifetime"},
    }
    assert floor_violations(graph) == [
        "envs.tasks.build (floor 1) imports envs.lifetime (floor 1)",
        "envs.xdesktop.qemu (floor 3) imports envs.host.gvisor (floor 4)",
    ]


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every import cycle a depth-first walk meets, each as "a -> b -> a"."""
    cycles, state = [], {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join([*trail[trail.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_no_import_cycles_between_modules():
    graph = module_graph()
    # A package's __init__ that re-exports its modules is not a cycle with them.
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    assert {"analysis.outcome", "analysis.figures", "analysis.runs"} <= set(graph)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checks_see_a_violation(tmp_path):
    """The rule itself can fail: an envab module importing the trainer is named."""
    path = tmp_path / "bad.py"
    path.write_text("from trainer.model import load\nimport envab.analysis.outcome\n")
    assert project_imports(path) >= {"trainer.model", "envab.analysis.outcome"}
    assert stage_of("envab.analysis.outcome") == "analysis" and stage_of("envab.io") == "envab"


def test_a_cycle_is_found():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a -> b -> c -> a"]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
