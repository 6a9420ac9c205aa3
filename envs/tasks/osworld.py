"""OSWorld-format task sources, frozen byte for byte: a directory of task files or a tasks.jsonl.

    python -m envab.envs.tasks.osworld --dir DIR [--index test_all.json] --tasks OUT.jsonl \
        --sources OUT_DIR --report OUT.json
    python -m envab.envs.tasks.osworld --jsonl tasks.jsonl --tasks OUT.jsonl --report OUT.json

A directory is OSWorld's `evaluation_examples` layout: `examples/<domain>/<id>.json`, with or
without an index mapping domains to ids (OSWorld's `test_all.json`). Without an index every file
under `examples/` is a task. Each task file is copied unchanged to `--sources` (same layout), and
its line in the frozen tasks.jsonl is the file's JSON plus two fields the pipeline adds:
`domain` (the folder; the split can stratify by it) and `source_sha256` (the sha256 of the
file's original bytes). A tasks.jsonl is kept line for line; its tasks keep their own fields.

An id listed under two domains (or found in two domain folders) is one task when the files are
byte-identical: it is kept under the first domain in sorted order, and the report says which
domains named it. Two different files with one id, an id that is not its file's name, an index
entry without a file, a malformed task, and a task naming a metric or getter that no verifier
here provides (envs/tasks/evaluators.py: OSWorld's desktop-env, or this project's checkers) are
refused with the file (or line) and the reason. The same inputs always give the same bytes out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envab.envs.tasks.evaluators import missing_evaluators, unsafe_evaluators
from envab.errors import Refusal, refused
from envab.hashing import sha256_bytes
from envab.io import atomic_write_bytes, atomic_write_json, write_jsonl

ADDED = ("domain", "source_sha256")  # the fields the freeze adds to a task file's JSON
CONJ = ("and", "or")


class TaskSourceError(Refusal, ValueError):
    """A task source that cannot be frozen; the message names the file or line and the reason."""


@dataclass(frozen=True)
class SourcedTask:
    task: dict  # the task's JSON, with the fields in ADDED when it came from a directory
    raw: bytes  # the original bytes (a file, or a tasks.jsonl line)
    origin: str  # the file (relative to the source) or "tasks.jsonl:<line>"


@dataclass
class Frozen:
    tasks: list[SourcedTask]
    duplicates: list[dict] = field(default_factory=list)
    from_dir: bool = False  # an OSWorld folder (one file a task), not a tasks.jsonl

    def report(self) -> dict:
        by_domain: dict[str, int] = {}
        for t in self.tasks:
            domain = t.task.get("domain") or "_none"
            by_domain[domain] = by_domain.get(domain, 0) + 1
        return {
            "tasks": len(self.tasks),
            "per_domain": dict(sorted(by_domain.items())),
            "duplicates": self.duplicates,
            "source_sha256": {t.task["id"]: sha256_bytes(t.raw) for t in self.tasks},
        }


# --- one task -----------------------------------------------------------------------------------


def _steps(steps: Any, where: str) -> None:
    if not isinstance(steps, list):
        raise TaskSourceError(f"{where} must be a list of steps")
    for i, step in enumerate(steps):
        if not isinstance(step, Mapping) or not isinstance(step.get("type"), str):
            raise TaskSourceError(f"{where}[{i}] must be an object with a string 'type'")
        if not isinstance(step.get("parameters", {}), Mapping):
            raise TaskSourceError(f"{where}[{i}].parameters must be an object")


def _getters(value: Any, where: str) -> None:
    if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
        raise TaskSourceError(f"{where} must be a getter: an object with a string 'type'")


def check_task(task: Any) -> dict:
    """`task` if it has OSWorld's shape, else TaskSourceError naming the first field that is wrong.

    id, instruction, config (a list of {type, parameters} steps) and evaluator: `func` a metric
    name or a list of them; with a list, `result`, `expected` and `options` (where given) are
    lists of the same length, one per metric; `conj` and or or; `postconfig` a list of steps.
    Only the shape: whether each metric and getter can run is the verifier's check."""
    if not isinstance(task, Mapping):
        raise TaskSourceError("a task must be a JSON object")
    tid = task.get("id")
    if not isinstance(tid, str) or not tid.strip():
        raise TaskSourceError("'id' must be a non-empty string")
    if not isinstance(task.get("instruction"), str) or not task["instruction"].strip():
        raise TaskSourceError(f"task {tid}: 'instruction' must be a non-empty string")
    _steps(task.get("config"), f"task {tid}: config")
    ev = task.get("evaluator")
    if not isinstance(ev, Mapping):
        raise TaskSourceError(f"task {tid}: 'evaluator' must be an object")
    func = ev.get("func")
    funcs = func if isinstance(func, list) else [func]
    if not funcs or not all(isinstance(f, str) and f for f in funcs):
        raise TaskSourceError(f"task {tid}: evaluator.func must be a metric name or a list of them")
    if "conj" in ev and ev["conj"] not in CONJ:
        raise TaskSourceError(f"task {tid}: evaluator.conj must be 'and' or 'or'")
    if "postconfig" in ev:
        _steps(ev["postconfig"], f"task {tid}: evaluator.postconfig")
    for key in ("result", "expected", "options"):
        if key not in ev:
            continue
        value = ev[key]
        if isinstance(func, list):
            if not isinstance(value, list) or len(value) != len(func):
                raise TaskSourceError(
                    f"task {tid}: evaluator.{key} must be a list of {len(func)}, one per metric"
                )
            items = value
        else:
            items = [value]
        for i, item in enumerate(items):
            where = f"task {tid}: evaluator.{key}" + (f"[{i}]" if isinstance(func, list) else "")
            if key == "options":
                if not isinstance(item, Mapping):
                    raise TaskSourceError(f"{where} must be an object")
            elif item is not None and item != {}:  # OSWorld writes {} or null for "none"
                _getters(item, where)
    return dict(task)


def _parse(raw: bytes, origin: str) -> dict:
    try:
        task = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TaskSourceError(f"{origin}: not JSON ({e})") from None
    try:
        task = check_task(task)
    except TaskSourceError as e:
        raise TaskSourceError(f"{origin}: {e}") from None
    gaps = missing_evaluators(task)
    if gaps:
        raise TaskSourceError(f"{origin}: task {task['id']}: no {', no '.join(gaps)}")
    unsafe = unsafe_evaluators(task)
    if (
        unsafe
    ):  # untrusted: nothing a task names may run on, or write outside the cache of, the host
        raise TaskSourceError(f"{origin}: task {task['id']}: {'; '.join(unsafe)}")
    return task


# --- sources ------------------------------------------------------------------------------------


def load_dir(root: str | Path, index: str | Path | None = None) -> Frozen:
    """The tasks of an OSWorld `evaluation_examples` folder (see the module's docstring)."""
    root = Path(root)
    examples = root / "examples"
    if not examples.is_dir():
        raise TaskSourceError(f"{root}: no examples/ folder (expected examples/<domain>/<id>.json)")
    listed = _index(Path(index) if index else None, examples)
    by_id: dict[str, SourcedTask] = {}
    named_by: dict[str, list[str]] = {}
    for domain, tid in listed:
        path = examples / domain / f"{tid}.json"
        origin = str(path.relative_to(root))
        if not path.is_file():
            raise TaskSourceError(f"{origin}: listed in the index under {domain}, but no such file")
        raw = path.read_bytes()
        task = _parse(raw, origin)
        if task["id"] != tid:
            raise TaskSourceError(f"{origin}: its id {task['id']!r} is not its file name")
        named_by.setdefault(tid, []).append(domain)
        if tid in by_id:
            if by_id[tid].raw != raw:
                first = by_id[tid].origin
                raise TaskSourceError(f"{origin}: id {tid} is also {first}, with other content")
            continue
        task.update(domain=domain, source_sha256=sha256_bytes(raw))
        by_id[tid] = SourcedTask(task, raw, origin)
    duplicates = [
        {"id": tid, "domains": domains, "kept": domains[0]}
        for tid, domains in sorted(named_by.items())
        if len(domains) > 1
    ]
    return Frozen(sorted(by_id.values(), key=lambda t: t.task["id"]), duplicates, from_dir=True)


def _index(index: Path | None, examples: Path) -> list[tuple[str, str]]:
    """(domain, id) pairs in sorted order: from the index, or every file under examples/."""
    if index is None:
        pairs = [(p.parent.name, p.stem) for p in examples.glob("*/*.json")]
        return sorted(pairs)
    try:
        listing = json.loads(index.read_bytes())
    except (OSError, json.JSONDecodeError) as e:
        raise TaskSourceError(f"{index}: cannot read the index ({e})") from None
    ok = isinstance(listing, Mapping) and all(
        isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in listing.values()
    )
    if not ok:
        raise TaskSourceError(f"{index}: the index must map each domain to a list of task ids")
    return sorted((domain, tid) for domain, ids in listing.items() for tid in ids)


def load_jsonl(path: str | Path) -> Frozen:
    """A tasks.jsonl, one task per line, kept line for line; a duplicated id is refused."""
    path = Path(path)
    tasks, seen = [], {}
    for n, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
        if not line.strip():
            continue
        origin = f"{path.name}:{n}"
        task = _parse(line, origin)
        if task["id"] in seen:
            raise TaskSourceError(f"{origin}: id {task['id']} is also line {seen[task['id']]}")
        seen[task["id"]] = n
        tasks.append(SourcedTask(task, line, origin))
    if not tasks:
        raise TaskSourceError(f"{path}: no tasks")
    return Frozen(tasks)


def write(frozen: Frozen, tasks_out: Path, sources_out: Path | None, report_out: Path) -> None:
    if frozen.from_dir:  # one line a task; the files' own bytes go to `sources_out`, if given
        if sources_out is not None:
            if sources_out.exists():
                shutil.rmtree(sources_out)
            for t in frozen.tasks:
                copy = sources_out / "examples" / t.task["domain"] / f"{t.task['id']}.json"
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_bytes(t.raw)
        write_jsonl(tasks_out, [t.task for t in frozen.tasks])
    else:  # a tasks.jsonl is kept line for line
        atomic_write_bytes(tasks_out, b"".join(t.raw.rstrip(b"\r\n") + b"\n" for t in frozen.tasks))
    atomic_write_json(report_out, frozen.report())


def original(task: Mapping) -> dict:
    """A frozen task as its file had it (the fields the freeze added taken out)."""
    return {k: v for k, v in task.items() if k not in ADDED}


def domains(tasks: Iterable[Mapping]) -> list[str]:
    return sorted({t.get("domain") or "_none" for t in tasks})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m envab.envs.tasks.osworld", description=__doc__)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--dir", type=Path, help="an OSWorld evaluation_examples folder")
    source.add_argument("--jsonl", type=Path, help="a tasks.jsonl, one task per line")
    p.add_argument("--index", type=Path, help="with --dir: {domain: [id, ...]} (test_all.json)")
    p.add_argument("--tasks", type=Path, required=True, help="the frozen tasks.jsonl to write")
    p.add_argument("--sources", type=Path, help="with --dir: where the task files are copied")
    p.add_argument("--report", type=Path, required=True)
    p.add_argument(
        "--runnable",
        choices=["xdesktop"],
        help="refuse a task this environment cannot set up or score (the real X desktop)",
    )
    args = p.parse_args(argv)
    try:
        frozen = load_dir(args.dir, args.index) if args.dir else load_jsonl(args.jsonl)
    except (Refusal, OSError) as e:
        return refused(e)
    if args.runnable == "xdesktop":
        from envab.envs.xdesktop.evaluate import unavailable  # the X desktop's routes, getters

        unrunnable = [(t, gaps) for t in frozen.tasks if (gaps := unavailable(t.task))]
        for t, gaps in unrunnable:
            print(f"error: {t.origin}: task {t.task['id']}: {'; '.join(gaps)}", file=sys.stderr)
        if unrunnable:
            print(f"error: {len(unrunnable)} of {len(frozen.tasks)} tasks cannot run on the X "
                  "desktop; nothing written", file=sys.stderr)  # fmt: skip
            return 2
    write(frozen, args.tasks, args.sources if args.dir else None, args.report)
    report = frozen.report()
    dup = (
        f"; {len(frozen.duplicates)} ids named by two domains, kept once"
        if frozen.duplicates
        else ""
    )
    print(f"tasks: {report['tasks']} frozen, per domain {report['per_domain']}{dup}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
