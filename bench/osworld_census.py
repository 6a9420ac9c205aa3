"""The census of an OSWorld task set on this machine: per X desktop image and sandbox, how many
tasks load, how many the freeze judges runnable, how many of those a no-op played (set up, no
action, scored) and with what result, and what blocks the rest, by reason.

    python bench/osworld_census.py --dir evaluation_examples \
        --index evaluation_examples/test_all.json [--images base full] [--sandbox gvisor qemu] \
        [--mirror osworld-files] [--play | --noop base=noop-base.json ...] [--out census.json]

For each image the set is frozen as the tasks job freezes it under the rule `{runnable: true}`
(`envs/osworld/source.py` `select`, world `xdesktop`, the image's applications), with its files
taken from `--mirror` (`python -m envab.envs.osworld.mirror make`) or, without one, not frozen
(`file:not_frozen`). "Runnable" is that judgement. The no-op play of the runnable tasks is
`bench/noop_check.py`'s, per sandbox: with `--play`, on every image already built under `--cache`
(nothing is built here: `python -m envab.envs.xdesktop.image --image IMAGE`; QEMU makes its disk
and warm snapshot from the built folder on first use); or read from an earlier record
(`--noop IMAGE=FILE`, noop_check's `--out`). An image neither played nor recorded says why in
its row. A task counts once under each of its reasons.

A study, not a pipeline step: what it counts depends on this machine (what is built, which
metric modules load, which sandboxes run), and nothing downstream reads it; the features it
counts with (the freeze's per-task report, the no-op record and rule) are the product's. Run
it under the machine's CPU lock when it plays: minutes a task under TCG.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
import types
from pathlib import Path

import noop_check  # bench/, beside this script

from envab.envs.osworld import source as osworld
from envab.envs.tasks import fetch
from envab.envs.xdesktop.apps import IMAGES
from envab.envs.xdesktop.image import cached, ensure_desktop

REPO = Path(__file__).resolve().parent.parent
SANDBOXES = ("gvisor", "qemu")
RULE = {"runnable": True}


def judge(args, image: str, work: Path) -> tuple[osworld.Frozen, Path | None]:
    """The freeze's judgement of the set on `image`; the runnable tasks' files map, when a
    mirror gave their files."""
    frozen = osworld.load_dir(args.dir, args.index, strict=False)
    if args.mirror is None:
        return osworld.select(frozen, RULE, "xdesktop", fetch.not_frozen, image), None
    freezer = fetch.Freezer(work / image, mirror=args.mirror)
    try:
        chosen = osworld.select(frozen, RULE, "xdesktop", freezer, image)
        freezer.write(t.task["id"] for t in chosen.tasks)
    finally:
        freezer.discard()
    return chosen, work / image / "files.json"


def play(args, image: str, tasks: list[dict], files: Path | None) -> dict:
    """noop_check's record of `tasks` on `image`, one play per sandbox of --sandbox."""
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    built = ensure_desktop(args.cache, log=log, image=image)
    ns = types.SimpleNamespace(files=files, screens=None)
    record = {"image": image, "image_digest": built.digest, "tasks": {}, "seconds": {}}
    for sandbox in args.sandbox:
        t0 = time.perf_counter()
        plays = noop_check.run_arm(sandbox, built, image, tasks, ns) if tasks else {}
        record["seconds"][sandbox] = round(time.perf_counter() - t0, 1)
        for tid, r in plays.items():
            entry = {k: v for k, v in r.items() if k != "screen"}
            record["tasks"].setdefault(tid, {})[sandbox] = entry
    return record


def noop_counts(record: dict | None, runnable: list[str], sandbox: str) -> dict:
    """Of the runnable tasks, on `sandbox`: played, valid (0 / 1), invalid by verdict."""
    if record is None:
        return {}
    out = collections.Counter()
    verdicts = collections.Counter()
    for tid in runnable:
        p = record["tasks"].get(tid, {}).get(sandbox)
        if p is None:
            out["not_played"] += 1
            continue
        out["played"] += 1
        if p["valid"] and p["score"] is not None:
            out["scores_1" if p["score"] >= 1.0 else "scores_0"] += 1
        else:
            verdicts[p.get("verdict", "invalid")] += 1
    return {**out, "invalid": dict(verdicts)}


def census(args) -> dict:
    out = {"source": str(args.dir), "index": str(args.index) if args.index else None,
           "mirror": str(args.mirror) if args.mirror else None, "images": {}}  # fmt: skip
    given = dict(item.split("=", 1) for item in args.noop)
    with tempfile.TemporaryDirectory(prefix="census-") as tmp:
        for image in args.images:
            chosen, files = judge(args, image, Path(tmp))
            report = chosen.report()
            runnable = [t.task["id"] for t in chosen.tasks]
            reasons = report["reasons"]["xdesktop"]
            kinds = collections.Counter()
            for row in report["per_task"].values():
                kinds.update({r.split(":", 1)[0] for r in row["reasons"]["xdesktop"]})
            record, why_not = None, None
            if image in given:
                record = osworld.check_noop_record(json.loads(Path(given[image]).read_text()),
                                                   image)  # fmt: skip
            elif not args.play:
                why_not = "not played (no --play, no --noop record)"
            elif not cached(args.cache, image):
                why_not = f"not played: the {image} image is not built under {args.cache}"
            else:
                record = play(args, image, [t.task for t in chosen.tasks], files)
            out["images"][image] = {
                "loaded": report["loaded"],
                "runnable": len(runnable),
                "runnable_per_domain": report["runnable"]["xdesktop"],
                "blocked": report["loaded"] - len(runnable),
                "reasons": reasons,
                "kinds": dict(kinds.most_common()),
                "noop": {s: noop_counts(record, runnable, s) for s in args.sandbox},
                "noop_not_played": why_not,
                "noop_seconds": (record or {}).get("seconds", {}),
                "noop_record": record,
            }
    return out


def markdown(c: dict, top: int) -> str:
    lines = [
        "| image | sandbox | loaded | runnable (freeze) | stopped only by files | no-op played "
        "| scores 0 | scores 1 | not a valid play (verdicts) | blocked |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    notes = []
    for image, r in c["images"].items():
        files_only = r["kinds"].get("file", 0)  # the freeze asks for files only when all else runs
        for sandbox, n in r["noop"].items():
            if n:
                bad = ", ".join(f"{v} {k}" for k, v in sorted(n["invalid"].items())) or "0"
                cells = (f"{n.get('played', 0)} | {n.get('scores_0', 0)} | "
                         f"{n.get('scores_1', 0)} | {bad}")  # fmt: skip
            else:
                cells = "— | — | — | —"
                notes.append(f"{image} on {sandbox}: {r['noop_not_played']}")
            lines.append(f"| {image} | {sandbox} | {r['loaded']} | {r['runnable']} | "
                         f"{files_only} | {cells} | {r['blocked']} |")  # fmt: skip
    lines += ["", *(f"- {note}" for note in dict.fromkeys(notes))] if notes else []
    for image, r in c["images"].items():
        lines += ["", f"Blocked on the {image} image, by kind of reason (a task under each of "
                  "its kinds):", "", "| kind | tasks |", "|---|---:|"]  # fmt: skip
        lines += [f"| `{k}` | {n} |" for k, n in r["kinds"].items()]
        lines += ["", f"By reason, the {top} commonest of {len(r['reasons'])}:", "",
                  "| reason | tasks |", "|---|---:|"]  # fmt: skip
        lines += [f"| `{k}` | {n} |" for k, n in list(r["reasons"].items())[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, required=True, help="an OSWorld evaluation_examples folder")
    p.add_argument("--index", type=Path, help="{domain: [id, ...]} (test_all.json)")
    p.add_argument("--images", nargs="+", choices=IMAGES, default=list(IMAGES))
    p.add_argument("--sandbox", nargs="+", choices=SANDBOXES, default=list(SANDBOXES))
    p.add_argument("--mirror", type=Path, help="a files mirror (envab.envs.osworld.mirror make)")
    p.add_argument("--play", action="store_true", help="play the no-ops on each built image")
    p.add_argument(
        "--noop",
        nargs="*",
        default=[],
        metavar="IMAGE=FILE",
        help="an earlier no-op record (bench/noop_check.py --out) per image",
    )
    p.add_argument("--cache", type=Path, default=REPO / "build" / "xdesktop")
    p.add_argument("--top", type=int, default=25, help="reasons listed per image")
    p.add_argument("--out", type=Path, help="the census as JSON (no-op records included)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    c = census(args)
    c["seconds"] = round(time.perf_counter() - t0, 1)
    if args.out:
        args.out.write_text(json.dumps(c, indent=1, sort_keys=True) + "\n")
    print(markdown(c, args.top))
    print(f"\n{c['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
