"""The no-op check of a frozen OSWorld task set: every task set up and scored untouched (no
action), on the fork host's gVisor sandboxes and the QEMU arm's VMs (the same image's files),
with the two sandboxes' screens after set-up compared pixel for pixel.

    python bench/noop_check.py --tasks FROZEN/tasks.jsonl [--image base|full]
                               [--sandbox gvisor|qemu|both] [--files FROZEN/files.json]
                               [--out noop.json] [--screens DIR] [--cache build/xdesktop]

A task whose untouched desktop already scores 1 teaches nothing and inflates success: the record
this writes (`--out`: {image, tasks: {id: {sandbox: {score, valid, verdict, ...}}}}) is what the
registered rule `tasks.osworld.select: {noop: exclude}` reads (`python -m envab.envs.osworld
... --image IMAGE --noop noop.json`), leaving such a task out as `noop:scores_1` and a task
whose no-op could not be played validly as `noop:invalid`.

It is a bench script, not a workflow step: a play needs the built image and gVisor or QEMU, minutes
a task under TCG, and its record is an input the pre-registration registers (as a files map is),
made once per image and task set, not per run. Prints one row per task: each sandbox's score and
verdict, the seconds of its create (restore and set-up) and verify, and the screens compared.
Exits 1 when any no-op scores 1 or any play is invalid.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from pathlib import Path

from real_tasks import compared  # bench/, beside this script

from envab.envs.host.pool import HostConfig, Pool
from envab.envs.xdesktop.apps import DEFAULT_IMAGE, IMAGES
from envab.envs.xdesktop.image import ensure_desktop

REPO = Path(__file__).resolve().parent.parent


def noop(pool: Pool, task: dict, screens: Path | None, arm: str) -> dict:
    """Set-up, no action, verify; an error (a set-up that raises) is an invalid play."""
    t0 = time.perf_counter()
    env = None
    try:
        env = pool.create(task)
        t1 = time.perf_counter()
        verdict = pool.verify(env["env_id"])
        t2 = time.perf_counter()
    except Exception as e:  # recorded, never hidden: the rule reads it as noop:invalid
        return {"score": None, "valid": False, "verdict": "error",
                "error": f"{type(e).__name__}: {e}".splitlines()[0][:300],
                "create_s": round(time.perf_counter() - t0, 2)}  # fmt: skip
    finally:
        if env is not None:
            pool.close(env["env_id"])
    shot = env.get("screenshot_png")
    if screens is not None and shot:
        (screens / arm).mkdir(parents=True, exist_ok=True)
        (screens / arm / f"{task['id']}.png").write_bytes(base64.b64decode(shot))
    return {
        "score": verdict["score"],
        "valid": bool(verdict["valid"]),
        "verdict": verdict["verdict"],
        "failed_gates": verdict.get("failed_gates", []),
        "flags": (verdict.get("audit") or {}).get("flags", []),
        "create_s": round(t1 - t0, 2),
        "verify_s": round(t2 - t1, 2),
        "screen": shot,
    }


def run_arm(arm: str, built, image: str, tasks: list[dict], args) -> dict[str, dict]:
    gvisor = arm == "gvisor"  # QEMU boots the disk it makes from the same folder
    pool = Pool(HostConfig(mode="fork" if gvisor else "restore", sandbox=arm, world="xdesktop",
                           rootfs=str(built.rootfs) if gvisor else None, image=image,
                           files=str(args.files) if args.files else None,
                           step_timeout_s=60, create_timeout_s=600))  # fmt: skip
    pool.start()
    out = {}
    try:
        for task in tasks:
            # the first play is the entry; every play (one at least) under `plays`, which the
            # rule's noop_plays reads (a task whose plays disagree is nondeterministic)
            plays = [noop(pool, task, args.screens, arm) for _ in range(args.plays)]
            out[task["id"]] = r = {
                **plays[0],
                "plays": [{k: p[k] for k in ("score", "valid", "verdict")} for p in plays],
            }
            print(f"{arm} {task['id']}: {r['score']} ({r['verdict']}) {r.get('error', '')}",
                  file=sys.stderr, flush=True)  # fmt: skip
    finally:
        pool.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=Path, required=True, help="a frozen tasks.jsonl")
    p.add_argument("--image", choices=IMAGES, default=DEFAULT_IMAGE)
    p.add_argument("--sandbox", choices=("gvisor", "qemu", "both"), default="both")
    p.add_argument("--files", type=Path, help="the frozen set's files.json (its downloads)")
    p.add_argument("--task", nargs="+", metavar="ID", help="only these tasks")
    p.add_argument("--cache", type=Path, default=REPO / "build" / "xdesktop")
    p.add_argument("--screens", type=Path, help="keep each screen after set-up as a PNG")
    p.add_argument("--out", type=Path, help="the no-op record (select.noop reads it)")
    p.add_argument(
        "--plays", type=int, default=1, help="no-op plays per task and sandbox (select.noop_plays)"
    )
    args = p.parse_args(argv)
    tasks = [json.loads(line) for line in args.tasks.read_text().splitlines() if line.strip()]
    if args.task:
        tasks = [t for t in tasks if t["id"] in set(args.task)]
    built = ensure_desktop(args.cache, log=lambda m: print(m, file=sys.stderr, flush=True),
                           image=args.image)  # fmt: skip
    arms = ("gvisor", "qemu") if args.sandbox == "both" else (args.sandbox,)
    plays, took = {}, {}
    for arm in arms:
        t0 = time.perf_counter()
        plays[arm] = run_arm(arm, built, args.image, tasks, args)
        took[arm] = time.perf_counter() - t0
    # screens apart from the plays: the rule reads `tasks` only
    record = {"image": args.image, "image_digest": built.digest, "tasks": {}, "screens": {}}
    lines = [
        f"X desktop image {args.image} {built.digest[:16]}; {len(tasks)} tasks; "
        + ", ".join(f"{arm} {took[arm]:.0f} s" for arm in arms),
        "",
        "| task | domain | "
        + " | ".join(f"{a} score (verdict) | {a} create s" for a in arms)
        + (" | screens after set-up, gVisor vs QEMU |" if len(arms) == 2 else " |"),
        "|---|---|" + "---|---:|" * len(arms) + ("---|" if len(arms) == 2 else ""),
    ]
    bad = 0
    for task in tasks:
        tid = task["id"]
        rows = {arm: plays[arm][tid] for arm in arms}
        entry = {arm: {k: v for k, v in r.items() if k != "screen"} for arm, r in rows.items()}
        record["tasks"][tid] = entry
        if len(arms) == 2:
            same = compared(rows["gvisor"].get("screen"), rows["qemu"].get("screen"))
            record["screens"][tid] = same
        bad += any(not r["valid"] or (r["score"] or 0) >= 1.0 for r in rows.values())
        cells = " | ".join(f"{r['score']} ({r['verdict']}) | {r['create_s']:.1f}"
                           for r in rows.values())  # fmt: skip
        screens = f" | {record['screens'][tid]} |" if len(arms) == 2 else " |"
        lines.append(f"| {tid} | {task.get('domain', '')} | {cells}{screens}")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
