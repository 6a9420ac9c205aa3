"""The real X desktop's tasks, each played with its oracle (must score 1), a no-op and its near
misses (must score 0), scored by the task's own evaluator (desktop-env's getters and metrics),
on the fork host's gVisor sandboxes, the QEMU arm's VMs (the same files), or both.

    python bench/real_tasks.py [--sandbox gvisor|qemu|both] [--tasks envs/xdesktop/tasks]
                               [--task ID ...] [--cache build/xdesktop] [--screens DIR]
                               [--out FILE.json] [--image base|full]

`--image full` plays on the full image (built on request, about 400 MB of packages) its own tasks,
`--tasks envs/xdesktop/tasks_full` (LibreOffice, Chromium, GIMP, VLC, Thunderbird).

`--osworld evaluation_examples` plays OSWorld's own tasks instead: the set frozen as the tasks job
freezes it (the registered rule `{runnable: true}` on `--image`), each task that has an entry in
`--solutions` (default `tests/fixtures/osworld-oracles.jsonl`: test data, not part of any task)
played with that oracle and its near misses, scored by OSWorld's own evaluator in the checker.

With `both`, every play runs on each arm and the two arms' screens are compared pixel for pixel,
after the set-up and after the last action: identical, or how many pixels differ and where.

Builds the X desktop's root file system first if it is not cached (minutes). Prints one row per
(task, play): the score, the verdict, and the time of create (restore + set-up), of the actions
and of the verification; then a fork of each task's set-up desktop (its editor open) into
`--fork` children: the time per child, a step and a screenshot on a child, and the memory of each
sandbox (proportional set size, from the verdict's audit). `--screens` keeps each play's last
screenshot as a PNG. Exits 1 when any oracle scores other than 1 or any no-op or near miss other
than 0, or any play fails to run.

`--out` is written again after every play (`"complete": false` until the last), so an interrupted
run keeps what it played; `--resume` reads it back and plays only what it lacks. A play that raises
is a row with verdict `error: ...` (a wrong score), and the run goes on to the next.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import time
from pathlib import Path

from envab.envs.host.pool import HostConfig, Pool
from envab.envs.xdesktop.image import ensure_desktop

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "envs" / "xdesktop" / "tasks"
OSWORLD_ORACLES = REPO / "tests" / "fixtures" / "osworld-oracles.jsonl"


def load_tasks(folder: Path) -> tuple[list[dict], dict[str, dict]]:
    tasks = [json.loads(p.read_text()) for p in sorted((folder / "examples").rglob("*.json"))]
    solutions = [json.loads(line) for line in (folder / "solutions.jsonl").read_text().splitlines()]
    return tasks, {s["id"]: s for s in solutions}


def load_osworld(root: Path, solutions: Path, image: str) -> tuple[list[dict], dict[str, dict]]:
    """OSWorld's set under `root` frozen by the registered rule `{runnable: true}` on `image`
    (no files: a task that downloads one is not runnable here), the tasks `solutions` solves.
    An oracle for a task the freeze leaves out is an error, with the freeze's reasons."""
    from envab.envs.osworld import source as osworld
    from envab.envs.tasks import fetch

    index = root / "test_all.json"
    frozen = osworld.load_dir(root, index if index.is_file() else None, strict=False)
    chosen = osworld.select(frozen, {"runnable": True}, "xdesktop", fetch.not_frozen, image)
    by_id = {t.task["id"]: t.task for t in chosen.tasks}
    given = [json.loads(line) for line in solutions.read_text().splitlines() if line.strip()]
    out = {s["id"]: s for s in given}
    missing = sorted(set(out) - set(by_id))
    if missing:
        rows = chosen.report()["per_task"].values()
        why = {r["id"]: r["reasons"]["xdesktop"] for r in rows}  # by frozen id, as oracles are
        named = "; ".join(f"{m} {why.get(m, ['not in the set'])}" for m in missing)
        raise SystemExit(f"oracles for tasks the freeze leaves out on the {image} image: {named}")
    return [by_id[i] for i in out], out


def plays(solution: dict) -> list[tuple[str, list[dict], float]]:
    """(name, actions, the score they must get)."""
    out = [("oracle", solution["oracle"], 1.0), ("no-op", [], 0.0)]
    out += [(f"near miss: {m['name']}", m["actions"], 0.0) for m in solution["near_misses"]]
    return out


def play(pool: Pool, task: dict, actions: list[dict], screens: Path | None, name: str) -> dict:
    t0 = time.perf_counter()
    env = pool.create(task)
    first = env.get("screenshot_png")
    t1 = time.perf_counter()
    last = env
    for action in actions:
        last = pool.step(env["env_id"], action, last["generation"])
        if not last["valid"]:
            break
    t2 = time.perf_counter()
    verdict = pool.verify(env["env_id"])
    t3 = time.perf_counter()
    if screens is not None and last.get("screenshot_png"):
        screens.mkdir(parents=True, exist_ok=True)
        shot = (
            screens / f"{task['id']}-{name.replace(' ', '_').replace(':', '').replace(',', '')}.png"
        )
        shot.write_bytes(base64.b64decode(last["screenshot_png"]))
    pool.close(env["env_id"])
    return {
        "score": verdict["score"],
        "verdict": verdict["verdict"],
        "create_s": t1 - t0,
        "actions_s": t2 - t1,
        "verify_s": t3 - t2,
        "first_screen": first,
        "last_screen": last.get("screenshot_png"),
    }


def compared(a_png: str | None, b_png: str | None) -> str:
    """Two screenshots (base64 PNG) compared pixel for pixel: "identical", or what differs."""
    from PIL import Image, ImageChops

    if not a_png or not b_png:
        return "missing"
    a, b = (Image.open(io.BytesIO(base64.b64decode(x))).convert("RGB") for x in (a_png, b_png))
    if a.size != b.size:
        return f"sizes {a.size} and {b.size}"
    diff = ImageChops.difference(a, b)
    box = diff.getbbox()
    if box is None:
        return "identical"
    changed = sum(1 for px in diff.getdata() if px != (0, 0, 0))
    return f"{changed} of {a.width * a.height} pixels differ, within {box}"


def forked(pool: Pool, task: dict, n: int) -> dict:
    """One fork of the task's set-up desktop into n children, measured."""
    parent = pool.create(task)
    t0 = time.perf_counter()
    children = pool.fork(parent["env_id"], n)["children"]
    per_child = (time.perf_counter() - t0) / n
    child = children[0]
    t0 = time.perf_counter()
    pool.step(child["env_id"], {"action_type": "TYPING", "parameters": {"text": "x"}}, 0)
    step_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    pool.observe(child["env_id"])
    observe_s = time.perf_counter() - t0
    memory = [pool.verify(e["env_id"])["audit"]["sandbox"]["memory_mib"] for e in children]
    for e in [parent, *children]:
        pool.close(e["env_id"])
    return {
        "fork_per_child_s": per_child,
        "step_s": step_s,
        "observe_s": observe_s,
        "memory_mib_median": statistics.median(memory),
        "valid": all(c["valid"] for c in children),
    }


def attempt(pool: Pool, task: dict, actions: list[dict], screens: Path | None, name: str) -> dict:
    """One play, or the error that stopped it: an hour of plays goes on past one broken play."""
    t0 = time.perf_counter()
    try:
        return play(pool, task, actions, screens, name)
    except Exception as e:  # noqa: BLE001 - recorded as a wrong score, never dropped
        took = time.perf_counter() - t0
        return {"score": None, "verdict": f"error: {type(e).__name__}: {e}"[:300],
                "create_s": took, "actions_s": 0.0, "verify_s": 0.0}  # fmt: skip


class Record:
    """The rows so far, written to `--out` after every play (atomically: a reader never sees half a
    file), and the plays an earlier, interrupted run of the same command already recorded."""

    def __init__(self, out: Path | None, digest: str, resume: bool) -> None:
        self.out, self.digest, self.rows, self.forks = out, digest, [], {}
        if resume and out is not None and out.is_file():
            earlier = json.loads(out.read_text())
            if earlier.get("image") != digest:
                raise SystemExit(f"{out} was played on image {earlier.get('image')}, not {digest}")
            self.rows = earlier["rows"]
            self.forks = earlier.get("forks", {})

    def played(self, arm: str, task: str, name: str) -> bool:
        return any((r["arm"], r["task"], r["play"]) == (arm, task, name) for r in self.rows)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.write(complete=False)

    def write(self, complete: bool) -> None:
        if self.out is None:
            return
        kept = [{k: v for k, v in r.items() if not k.endswith("_screen")} for r in self.rows]
        body = {"image": self.digest, "complete": complete, "rows": kept, "forks": self.forks}
        part = self.out.with_name(self.out.name + ".part")
        part.write_text(json.dumps(body, indent=2))
        part.replace(self.out)


def run_arm(sandbox: str, built, tasks, solutions, args, record: Record) -> float:
    """Every play of every task on one arm not yet in `record`, each added to it as it ends, then
    the forks (gVisor only); returns the time the arm took."""
    gvisor = sandbox == "gvisor"  # QEMU boots the disk it makes from the same folder
    pool = Pool(HostConfig(mode="fork" if gvisor else "restore", sandbox=sandbox,
                           world="xdesktop", rootfs=str(built.rootfs) if gvisor else None,
                           image=built.image,
                           step_timeout_s=args.step_timeout, create_timeout_s=600))  # fmt: skip
    t0 = time.perf_counter()
    pool.start()
    try:
        for task in tasks:
            for name, actions, must in plays(solutions[task["id"]])[
                : 1 if args.oracle_only else None
            ]:
                if record.played(sandbox, task["id"], name):
                    continue
                r = attempt(pool, task, actions, args.screens and args.screens / sandbox, name)
                record.add({"arm": sandbox, "task": task["id"], "play": name, "must": must, **r})
                print(f"{sandbox} {task['id']} {name}: {r['score']} ({r['verdict']}) "
                      f"{r['create_s'] + r['actions_s'] + r['verify_s']:.0f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
        if args.fork and gvisor:
            for t in tasks:
                if t["id"] not in record.forks:
                    record.forks[t["id"]] = forked(pool, t, args.fork)
                    record.write(complete=False)
    finally:
        pool.stop()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sandbox", choices=("gvisor", "qemu", "both"), default="gvisor")
    p.add_argument("--tasks", type=Path, default=TASKS)
    p.add_argument(
        "--osworld",
        type=Path,
        metavar="DIR",
        help="OSWorld's evaluation_examples: play its tasks that --solutions solves",
    )
    p.add_argument(
        "--solutions",
        type=Path,
        default=OSWORLD_ORACLES,
        help="with --osworld: one JSON line per task (id, oracle, near_misses)",
    )
    p.add_argument("--task", nargs="+", metavar="ID", help="only these tasks (default: all)")
    p.add_argument("--cache", type=Path, default=REPO / "build" / "xdesktop")
    p.add_argument("--screens", type=Path)
    p.add_argument("--fork", type=int, default=4, help="children per measured fork (0: none)")
    p.add_argument("--out", type=Path, help="JSON of every play, written after each one")
    p.add_argument(
        "--resume",
        action="store_true",
        help="with --out: keep the plays it holds (same image) and play only the rest",
    )
    p.add_argument("--image", choices=("base", "full"), default="base")
    p.add_argument(
        "--step-timeout",
        type=float,
        default=60,
        help="seconds one action may take (default 60); QEMU under TCG, with no KVM, may need more",
    )
    p.add_argument(
        "--oracle-only",
        action="store_true",
        help="play each task's oracle only (an application that starts in minutes)",
    )
    args = p.parse_args(argv)
    built = ensure_desktop(args.cache, log=lambda m: print(m, file=sys.stderr, flush=True),
                           image=args.image)  # fmt: skip
    if args.osworld:
        tasks, solutions = load_osworld(args.osworld, args.solutions, args.image)
    else:
        tasks, solutions = load_tasks(args.tasks)
    if args.task:
        unknown = set(args.task) - {t["id"] for t in tasks}
        if unknown:
            p.error(f"no such task in {args.tasks}: {', '.join(sorted(unknown))}")
        tasks = [t for t in tasks if t["id"] in args.task]
    arms = ("gvisor", "qemu") if args.sandbox == "both" else (args.sandbox,)
    record = Record(args.out, built.digest, args.resume)
    took = {arm: run_arm(arm, built, tasks, solutions, args, record) for arm in arms}
    chosen = {t["id"] for t in tasks}
    rows = [r for r in record.rows if r["arm"] in arms and r["task"] in chosen]
    forks = {k: f for k, f in record.forks.items() if k in chosen}
    wrong = sum(r["score"] != r["must"] for r in rows)
    spent = {a: sum(r["create_s"] + r["actions_s"] + r["verify_s"] for r in rows if r["arm"] == a)
             for a in arms}  # fmt: skip
    lines = [
        f"X desktop {built.image} {built.digest[:16]}; "
        + ", ".join(
            f"{arm}: {sum(r['arm'] == arm for r in rows)} plays taking "
            f"{spent[arm]:.0f} s ({took[arm]:.0f} s this run, host start included)"
            for arm in arms
        ),  # fmt: skip
        "",
        "| arm | task | play | score (must) | verdict | create s | actions s | verify s |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['task']} | {r['play']} | {r['score']} ({r['must']:g}) "
            f"| {r['verdict']} | {r['create_s']:.2f} | {r['actions_s']:.2f} | {r['verify_s']:.2f} |"
        )
    if forks:
        lines += ["", f"| task | fork per child s ({args.fork} children) | step s | screenshot s "
                  "| MiB per sandbox (median) |", "|---|---:|---:|---:|---:|"]  # fmt: skip
        for tid, f in forks.items():
            lines.append(f"| {tid} | {f['fork_per_child_s']:.2f} | {f['step_s']:.2f} "
                         f"| {f['observe_s']:.2f} | {f['memory_mib_median']:.0f} |")  # fmt: skip
    if len(arms) == 2:
        by = {(r["arm"], r["task"], r["play"]): r for r in rows}
        lines += ["", "| task | play | screens after set-up, gVisor vs QEMU | after the last "
                  "action |", "|---|---|---|---|"]  # fmt: skip
        for r in (r for r in rows if r["arm"] == "gvisor"):
            q = by.get(("qemu", r["task"], r["play"]), {})
            lines.append(f"| {r['task']} | {r['play']} "
                         f"| {compared(r.get('first_screen'), q.get('first_screen'))} "
                         f"| {compared(r.get('last_screen'), q.get('last_screen'))} |")  # fmt: skip
    print("\n".join(lines))
    record.write(complete=True)
    return 1 if wrong or not all(f["valid"] for f in forks.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
