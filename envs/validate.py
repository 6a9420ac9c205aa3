"""Prove each task on a live backend: the checker must separate the oracle from everything else.

    python -m envab.envs.validate --tasks DIR/tasks.jsonl --solutions DIR/solutions.jsonl

For every task it plays, each in a fresh session, the no-op (no action), the oracle and every
near miss, and accepts the task only when the oracle scores 1 and all the others score 0, every
play valid. Exits non-zero naming the rejected tasks. It needs only `create(task) -> session`
with `session.step(action)`, `session.verify()["score"|"valid"|"verdict"]` and
`session.close()`, so it runs on the in-process backend (`envab.envs.tasks.local`, the default), on
the embedded host over HTTP (`--embedded fork|restore`), on any Drums host (`--url`, token
from DRUMS_TOKEN_FILE or DRUMS_TOKEN) through the Drums client, or on any arm of config.yaml
(`--arm '{"backend": "qemu"}'`), opened by `envab.envs.arms.open_arm`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from envab.envs.arm_schema import MODES
from envab.envs.arms import ArmError, arm_settings, open_arm
from envab.envs.drums import EMBEDDED
from envab.envs.tasks.local import LocalBackend
from envab.errors import refused
from envab.io import atomic_write_json, read_jsonl

NOOP = "noop"
ORACLE = "oracle"


@dataclass
class Play:
    name: str
    score: float | None
    valid: bool
    verdict: str
    error: str | None = None


@dataclass
class TaskResult:
    id: str
    accepted: bool
    reasons: list[str] = field(default_factory=list)
    plays: list[Play] = field(default_factory=list)


def play(create: Callable[[Mapping], object], task: Mapping, name: str, actions: list) -> Play:
    """One episode in a fresh session: set-up, the actions in order, verify, close."""
    session = None
    try:
        session = create(task)
        for action in actions:
            session.step(action)
        v = session.verify()
        return Play(name, v["score"], bool(v["valid"]), str(v["verdict"]))
    except Exception as e:  # a play that cannot run rejects the task; the reason says why
        return Play(name, None, False, "error", f"{type(e).__name__}: {e}".splitlines()[0])
    finally:
        if session is not None:
            session.close()


def judge(task_id: str, plays: list[Play]) -> TaskResult:
    reasons = []
    for p in plays:
        want = 1.0 if p.name == ORACLE else 0.0
        if p.error:
            reasons.append(f"{p.name} failed to run ({p.error})")
        elif not p.valid:
            reasons.append(f"{p.name} was invalid ({p.verdict})")
        elif p.score != want:
            reasons.append(f"{p.name} scored {p.score}, expected {want}")
    return TaskResult(task_id, not reasons, reasons, plays)


def validate_task(create: Callable, task: Mapping, solution: Mapping) -> TaskResult:
    plays = [play(create, task, NOOP, []), play(create, task, ORACLE, solution["oracle"])]
    plays += [play(create, task, m["name"], m["actions"]) for m in solution["near_misses"]]
    return judge(task["id"], plays)


def validate(
    create: Callable, tasks: Iterable[Mapping], solutions: Iterable[Mapping]
) -> list[TaskResult]:
    """One TaskResult per task, in the tasks' order; a task without solutions is rejected."""
    by_id = {s["id"]: s for s in solutions}
    results = []
    for task in tasks:
        solution = by_id.pop(task["id"], None)
        if solution is None:
            results.append(TaskResult(task["id"], False, ["no solutions for this task"]))
        else:
            results.append(validate_task(create, task, solution))
    for orphan in by_id:
        results.append(TaskResult(orphan, False, ["solutions for a task not in the task set"]))
    return results


def arm_argument(text: str) -> dict:
    """--arm: an arm config as in config.yaml, checked against the schema here, at the edge."""
    try:
        arm = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    try:
        arm_settings(arm)
    except ArmError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return arm


@contextlib.contextmanager
def open_backend(
    url: str | None = None,
    embedded: str | None = None,
    arm: Mapping | None = None,
    host_log: str | None = None,
) -> Iterator[object]:
    """The backend the CLI validates on: in-process by default, else the arm its flags name
    (--url: a Drums host; --embedded MODE: the embedded host; --arm: any arm of config.yaml);
    an embedded host appends its log to `host_log`."""
    if url is not None:
        arm = {"backend": "drums", "url": url}
    elif embedded is not None:
        arm = {"backend": "drums", "url": EMBEDDED, "mode": embedded}
    if arm is None:
        yield LocalBackend()
        return
    with open_arm(arm, log_path=host_log) as backend:
        yield backend


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m envab.envs.validate", description="Validate tasks.")
    p.add_argument("--tasks", type=Path, required=True)
    p.add_argument("--solutions", type=Path, required=True)
    p.add_argument("--report", type=Path, help="write every play's score and verdict as JSON")
    p.add_argument(
        "--host-log", help="where an embedded host appends its log (its reasons for env_failure)"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", help="validate on this Drums host (default: in-process)")
    where.add_argument(
        "--embedded",
        choices=MODES,
        help="start the embedded host in this mode and validate over HTTP",
    )
    where.add_argument(
        "--arm",
        type=arm_argument,
        help='validate on this arm, given as in config.yaml: \'{"backend": "qemu"}\'',
    )
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    try:
        tasks, solutions = list(read_jsonl(args.tasks)), list(read_jsonl(args.solutions))
    except (OSError, ValueError) as e:
        return refused(e, prefix="cannot read the task set")
    try:
        with open_backend(args.url, args.embedded, args.arm, args.host_log) as backend:
            results = validate(backend.create, tasks, solutions)
    except ArmError as e:  # e.g. --url embedded, which names no mode
        return refused(e, prefix="cannot open the arm")
    rejected = [r for r in results if not r.accepted]
    plays = sum(len(r.plays) for r in results)
    if args.report:
        atomic_write_json(
            args.report,
            {
                "accepted": len(results) - len(rejected),
                "rejected": [r.id for r in rejected],
                "tasks": [asdict(r) for r in results],
            },
        )
    for r in rejected:
        print(f"rejected {r.id}: {'; '.join(r.reasons)}", file=sys.stderr)
    print(
        f"{len(results) - len(rejected)}/{len(results)} tasks accepted ({plays} plays) "
        f"in {time.perf_counter() - t0:.2f}s"
    )
    return 1 if rejected else 0


if __name__ == "__main__":
    sys.exit(main())
