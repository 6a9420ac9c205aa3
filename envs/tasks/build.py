"""Build the seeded task set: tasks.jsonl, solutions.jsonl and index.json.

    python -m envab.envs.tasks.build --seed 1 --per-family 12 --out DIR [--check]
    python -m envab.envs.tasks.build ... --tasks T.jsonl --solutions S.jsonl --index I.json
        [--layout seeded|templated --templates K --families ...]

Every task is a function of (seed, family, index) and the screen size. tasks.jsonl is what an
environment is created with (no solutions inside); solutions.jsonl holds, per task id, the oracle
action list and the near misses, for the validator only. `--check` builds twice and fails on any
byte difference. GENERATOR_VERSION changes whenever a seeded build's bytes change, and
templated.VERSION whenever a templated build's do.

`--layout seeded` (the default) places widgets at seeded random spots (envs/tasks/layout.py);
`--layout templated --templates K` uses K layout templates per family told apart by a global cue
(envs/tasks/templated.py; click_button only so far). A templated task's `generator` field and
the index name the layout and K; a seeded build's bytes are those of before the option existed.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from envab.envs.desktop import Desktop, screen_of
from envab.envs.tasks import templated
from envab.envs.tasks.checkers import out_of_scope_digest
from envab.envs.tasks.families import FAMILIES
from envab.errors import refused
from envab.hashing import sha256_bytes, sha256_file
from envab.io import atomic_write_bytes, atomic_write_json, write_jsonl

GENERATOR_VERSION = "1"
OUTPUTS = ("tasks.jsonl", "solutions.jsonl", "index.json")
LAYOUTS = ("seeded", "templated")


def task_rng(seed: int, family: str, index: int) -> random.Random:
    """The one source of randomness of a task, independent of every other task."""
    return random.Random(int(sha256_bytes(f"{seed}/{family}/{index}".encode())[:16], 16))


def _digests(desktop: Desktop, may_change: list[str]) -> dict:
    """The evaluator's gates on the set-up desktop: its whole state, and the part the task's
    actions may not change."""
    return {
        "initial_state_sha256": desktop.state_hash(),
        "scope": {
            "may_change": may_change,
            "unchanged_sha256": out_of_scope_digest(desktop.state(), may_change),
        },
    }


def cue_shuffled(task: dict) -> dict:
    """A templated task with its window's theme (the screen's cue: which template, so which
    column is live) drawn at random from its build's themes, seeded by the task id. The same
    buttons in the same places, the same oracle; the screen no longer says where to click. The
    warm start's demonstrations under `training.sft.cue: shuffled` (trainer/sft.py)."""
    generator = task.get("generator", {})
    if generator.get("layout") != "templated":
        raise ValueError(
            f"task {task['id']}: only a templated task has a screen cue to shuffle "
            f"(its layout: {generator.get('layout', 'seeded')})"
        )
    themes = templated.CUES[: generator["templates"]]
    theme = random.Random(task["id"]).choice(themes)
    config = [
        {**e, "parameters": {**e["parameters"], "theme": theme}} if e["type"] == "window" else e
        for e in task["config"]
    ]
    desktop = Desktop(*screen_of(config))
    desktop.setup(config)
    gates = _digests(desktop, task["evaluator"]["scope"]["may_change"])
    return {**task, "config": config, "evaluator": {**task["evaluator"], **gates}}


def make_task(
    seed: int,
    family: str,
    index: int,
    width: int = 128,
    height: int = 128,
    layout: str = "seeded",
    templates: int = 4,
):
    """(task, solution) for one (seed, family, index) under a layout."""
    generator = {"version": GENERATOR_VERSION, "seed": seed, "index": index}
    try:
        rng = task_rng(seed, family, index)
        if layout == "templated":
            spec, template = templated.make_spec(family, rng, width, height, seed, templates)
            generator.update(
                version=templated.VERSION, layout=layout, templates=templates, template=template
            )
        elif layout == "seeded":
            spec = FAMILIES[family](rng, width, height)
        else:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        desktop = Desktop(width, height)
        desktop.setup(spec.config)
    except ValueError as e:
        raise ValueError(f"{family} task {index} on a {width}x{height} screen: {e}") from None
    task_id = f"{family}-s{seed}-{index:03d}"
    task = {
        "id": task_id,
        "family": family,
        "instruction": spec.instruction,
        "config": spec.config,
        "evaluator": {
            "func": spec.func,
            "options": spec.options,
            **_digests(desktop, spec.may_change),
        },
        "generator": generator,
    }
    near = [
        {"name": name, "actions": actions}
        for name, actions in spec.near_misses.items()
        if actions and actions != spec.oracle  # the no-op is played anyway
    ]
    return task, {"id": task_id, "oracle": spec.oracle, "near_misses": near}


def build(
    seed: int,
    per_family: int,
    width: int = 128,
    height: int = 128,
    families: list[str] | None = None,
    layout: str = "seeded",
    templates: int = 4,
) -> tuple[list[dict], list[dict]]:
    tasks, solutions = [], []
    for family in families or list(FAMILIES):
        for index in range(per_family):
            task, solution = make_task(seed, family, index, width, height, layout, templates)
            tasks.append(task)
            solutions.append(solution)
    return tasks, solutions


def output_paths(out: Path) -> dict[str, Path]:
    """The three files of a build in one folder, by name."""
    return {name: Path(out) / name for name in OUTPUTS}


def write_build(
    out: Path | dict[str, Path],
    seed: int,
    per_family: int,
    width: int = 128,
    height: int = 128,
    families: list[str] | None = None,
    layout: str = "seeded",
    templates: int = 4,
) -> dict:
    """Write the three files (each atomically; into a folder, or to the paths given by name) and
    return the index."""
    paths = out if isinstance(out, dict) else output_paths(out)
    tasks, solutions = build(seed, per_family, width, height, families, layout, templates)
    write_jsonl(paths["tasks.jsonl"], tasks)
    write_jsonl(paths["solutions.jsonl"], solutions)
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t["family"]] = counts.get(t["family"], 0) + 1
    index = {
        "generator_version": templated.VERSION if layout == "templated" else GENERATOR_VERSION,
        "seed": seed,
        "per_family": per_family,
        "screen": [width, height],
        **({"layout": layout, "templates": templates} if layout != "seeded" else {}),
        "families": counts,
        "tasks": len(tasks),
        "near_misses": sum(len(s["near_misses"]) for s in solutions),
        "sha256": {name: sha256_file(paths[name]) for name in ("tasks.jsonl", "solutions.jsonl")},
    }
    atomic_write_json(paths["index.json"], index)
    return index


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m envab.envs.tasks.build", description="Build a task set."
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--per-family", type=int, default=12)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--out", type=Path, help="a folder for tasks.jsonl, solutions.jsonl, index.json"
    )
    where.add_argument("--tasks", type=Path, help="with --solutions and --index: each file's path")
    p.add_argument("--solutions", type=Path)
    p.add_argument("--index", type=Path)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--height", type=int, default=128)
    p.add_argument("--families", nargs="+", choices=list(FAMILIES), help="default: all")
    p.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="seeded",
        help="seeded: random spots per task; templated: K templates per family",
    )
    p.add_argument("--templates", type=int, default=4, help="templated only: K (2..4)")
    p.add_argument("--check", action="store_true", help="build twice, fail on any byte difference")
    args = p.parse_args(argv)
    if args.per_family < 1:
        p.error("--per-family must be at least 1")
    if args.tasks and not (args.solutions and args.index):
        p.error("--tasks needs --solutions and --index")
    paths = (
        output_paths(args.out)
        if args.out
        else {
            "tasks.jsonl": args.tasks,
            "solutions.jsonl": args.solutions,
            "index.json": args.index,
        }
    )
    t0 = time.perf_counter()
    build_args = (
        args.seed,
        args.per_family,
        args.width,
        args.height,
        args.families,
        args.layout,
        args.templates,
    )
    try:
        if args.check:
            with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
                write_build(Path(a), *build_args)
                write_build(Path(b), *build_args)
                for name in OUTPUTS:
                    if (Path(a) / name).read_bytes() != (Path(b) / name).read_bytes():
                        print(f"build is not deterministic: {name} differs", file=sys.stderr)
                        return 1
                for name in OUTPUTS:
                    atomic_write_bytes(paths[name], (Path(a) / name).read_bytes())
            index = json.loads(paths["index.json"].read_text())
        else:
            index = write_build(paths, *build_args)
    except ValueError as e:
        return refused(e, prefix="task build failed", code=1)
    print(
        f"{index['tasks']} tasks ({len(index['families'])} families, {index['near_misses']} near "
        f"misses) in {paths['tasks.jsonl'].parent} in {time.perf_counter() - t0:.2f}s"
        + (" - two builds byte-identical" if args.check else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
