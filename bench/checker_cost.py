"""What the X desktop's checker box costs an evaluation: the seconds from asking for a score to
having it, through a real confined checker process scoring desktop-env's real metrics on files a
stand-in environment serves, for this checkout's code and another commit's, interleaved.

    python bench/checker_cost.py --before 554b62c^ --evaluations 20 --out cost.json

Each round times one evaluation of each evaluator on each side, the sides in an order that
alternates (ABBA), so load that comes and goes lands on both. The other commit's code runs from
a `git worktree` of it, with this checkout's installed dependencies: a small interpreter
environment of its own (made under the output's folder) whose import path maps the package to
that worktree, as the editable install maps it to this one. Prints, and writes to --out, each
side's median, 10th and 90th percentile seconds per evaluation and the after/before ratio of
the medians; every evaluation must score what its evaluator should (1 on the served answer),
or the run stops: a box that broke a metric is not cheaper.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# desktop-env's metrics, each on files the stand-in environment serves: a text diff, and a
# command's output matched (both scored 1 on these files).
EVALUATORS = {
    "diff_text_file": {
        "func": "diff_text_file",
        "result": {"type": "vm_file", "path": "/root/todo.txt", "dest": "todo.txt"},
        "expected": {"type": "vm_file", "path": "/gold/todo.txt", "dest": "gold.txt"},
    },
    "exact_match": {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": ["cat", "/root/todo.txt"]},
        "expected": {"type": "rule", "rules": {"expected": "water the plants\n"}},
    },
}
FILES = {"/root/todo.txt": b"water the plants\n", "/gold/todo.txt": b"water the plants\n"}


def http(method: str, path: str, content_type: str, body: bytes) -> dict:
    """The in-environment server's /file and /execute, on FILES."""
    if path == "/file":
        name = urllib.parse.parse_qs(body.decode()).get("file_path", [""])[0]
        if name in FILES:
            return {"status": 200, "content_type": "application/octet-stream", "body": FILES[name]}
        return {"status": 404, "content_type": "text/plain", "body": b"no such file"}
    if path == "/execute":
        command = json.loads(body)["command"]
        output = FILES.get(command[-1], b"").decode() if command[0] == "cat" else ""
        reply = {"status": "success", "output": output, "error": "", "returncode": 0}
        body = json.dumps(reply).encode()
        return {"status": 200, "content_type": "application/json", "body": body}
    return {"status": 200, "content_type": "text/plain", "body": b""}


def one_side(rounds: int) -> None:
    """Run in the side's interpreter: score each evaluator `rounds` times, one JSON line each."""
    from envab.envs.xdesktop import evaluate

    for _ in range(rounds):
        for name, evaluator in EVALUATORS.items():
            start = time.perf_counter()
            score = evaluate.evaluate(evaluator, http, lambda steps: None)
            print(json.dumps({"evaluator": name, "s": time.perf_counter() - start, "score": score}))
            sys.stdout.flush()


def shadow_interpreter(checkout: Path, folder: Path) -> Path:
    """A venv whose import path is this checkout's installed dependencies and `checkout`'s
    packages (its pyproject's package-dir), not this checkout's."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = next(folder.glob("lib/python3*/site-packages"))
    ours = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    mapping = tomllib.loads((checkout / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    mapping = {name: str((checkout / where).resolve()) for name, where in mapping.items()}
    (site / "_bench_checkout.py").write_text(
        "import importlib.machinery, importlib.util, sys\n"
        f"MAPPING = {mapping!r}\n"
        "class Finder:\n"
        "    @classmethod\n"
        "    def find_spec(cls, name, path=None, target=None):\n"
        "        if name in MAPPING:\n"
        "            return importlib.util.spec_from_file_location(\n"
        "                name, MAPPING[name] + '/__init__.py',\n"
        "                submodule_search_locations=[MAPPING[name]])\n"
        "        return None\n"
        "sys.meta_path.insert(0, Finder)\n"
    )
    # dependencies by path only: the editable install's own .pth there is not processed
    (site / "_bench_checkout.pth").write_text(f"{ours}\nimport _bench_checkout\n")
    return folder / "bin" / "python"


def run_side(python: Path, rounds: int) -> list[dict]:
    done = subprocess.run(
        [str(python), "-I", __file__, "--side", "--evaluations", str(rounds)],
        capture_output=True, text=True, check=False, timeout=3600,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{python}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def summary(times: list[float]) -> dict:
    deciles = statistics.quantiles(times, n=10)
    return {"n": len(times), "median_s": statistics.median(times), "p10_s": deciles[0],
            "p90_s": deciles[-1]}  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", help="the commit to compare with (default: none, this side only)")
    p.add_argument("--evaluations", type=int, default=10, help="rounds: each evaluator per round")
    p.add_argument("--out", help="writes: the summary as JSON")
    p.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side:
        one_side(args.evaluations)
        return 0
    sides = {"after": Path(sys.executable)}
    with tempfile.TemporaryDirectory(prefix="checker-cost-") as tmp:
        if args.before:
            tree = Path(tmp, "before")
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree),
                            args.before], check=True, capture_output=True)  # fmt: skip
            sides["before"] = shadow_interpreter(tree, Path(tmp, "venv"))
        try:
            times: dict[str, list[float]] = {side: [] for side in sides}
            for k in range(args.evaluations):
                order = list(sides) if k % 4 in (0, 3) else list(sides)[::-1]  # ABBA
                for side in order:
                    for record in run_side(sides[side], 1):
                        if record["score"] != 1.0:
                            raise SystemExit(f"{side}: {record['evaluator']} scored "
                                             f"{record['score']}, not 1")  # fmt: skip
                        times[side].append(record["s"])
        finally:
            if args.before:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                str(Path(tmp, "before"))], capture_output=True)  # fmt: skip
    result = {side: summary(t) for side, t in times.items()}
    if "before" in result:
        result["after_over_before"] = result["after"]["median_s"] / result["before"]["median_s"]
        result["before_commit"] = args.before
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
