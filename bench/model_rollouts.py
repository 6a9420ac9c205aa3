"""Valid rollouts per host-hour with the model playing, at 1, 2, 4 and 8 parallel environments,
on each arm: the companion of `bench/envs_bench.py`, whose oracle takes no time.

    python bench/model_rollouts.py [--run .test/results/test-small-v1/drums/seed1]
                                   [--checkpoint NAME] [--arms qemu gvisor process]
                                   [--seconds 30] [--max-steps 1] [--out FILE.json]

A finished run's checkpoint (default: its last) plays its experiment's held-out tasks as the
held-out evaluation plays them (`envab.eval.episodes.play`: the run's tools, its pinned turn
length and turn ending, greedy), `parallel` episodes at once, each in an environment of its own,
one model shared by every player (as one trainer process serves every session of its batch).
One rollout: create, the model's turns, verify, close; counted when the verdict is valid. A
host-hour is an hour of wall time with the arm held and the model loaded. Trainer and
environments share the machine's cores, so the cell measures the pair, not the arm alone.
The QEMU pool is driven from one thread, as training drives it: one cell.

Make the run first: `snakemake --directory .test --cores 2` (about 3 to 5 minutes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from envab.envs.arms import open_arm
from envab.eval.episodes import Protocol, play
from envab.io import read_jsonl
from envab.layout import Layout
from envab.trainer import agent
from envab.trainer.generation import Generation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from envs_bench import ARMS, PARALLEL, timed_cell  # noqa: E402  the same arms, configured alike

REPO = Path(__file__).resolve().parent.parent
RUN = Layout("test-small-v1", REPO / ".test").run("drums", 1)


def cell(policy, backend, tasks, protocol: Protocol, parallel: int, seconds: float) -> dict:
    """`parallel` players for `seconds`, each playing one episode after another."""

    def episode(i: int):
        e = play(policy, backend, tasks[i % len(tasks)], protocol, seed=i)
        yield e["verdict"] == "valid", e["score"] == 1.0, e["verdict"]

    generation_before = policy.generation_s
    counts = timed_cell(parallel, seconds, episode)
    return {**counts, "generation_s": policy.generation_s - generation_before}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, default=RUN, help="a finished run's folder")
    p.add_argument("--checkpoint", help="a checkpoint's name (default: the run's last)")
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    p.add_argument("--seconds", type=float, default=30.0, help="per cell")
    p.add_argument("--max-steps", type=int, default=1, help="the model's turns per episode")
    p.add_argument("--out", type=Path, help="also write the numbers as JSON")
    args = p.parse_args(argv)
    if not (args.run / "pins.json").is_file():
        p.error(f"{args.run} holds no finished run (no pins.json): make one first (see --help)")
    pins = json.loads((args.run / "pins.json").read_text())
    names = [r["checkpoint"] for r in read_jsonl(args.run / "checkpoints.jsonl")]
    name = args.checkpoint or names[-1]
    if name not in names:
        p.error(f"no checkpoint {name!r} in {args.run}: {', '.join(names)}")
    tasks = list(read_jsonl(args.run.parent.parent / "tasks" / "heldout.jsonl"))
    generation = Generation.pinned(pins["training"], temperature=0.0)
    protocol = Protocol(episodes_per_task=1, seeds=(0,), max_steps=args.max_steps,
                        max_invalid_retries=0, temperature=0.0,
                        max_new_tokens=generation.max_new_tokens,
                        turn_end=generation.turn_end)  # fmt: skip

    from envab.eval.policy import Policy  # torch, once the arguments are known to be good

    policy = Policy(args.run / "checkpoints" / name, agent.tool_set(pins["training"]["tools"]),
                    protocol.generation)  # fmt: skip
    results: dict = {"run": str(args.run), "checkpoint": name, "tasks": len(tasks), "arms": {}}
    for arm_name in args.arms:
        arm = ARMS[arm_name]
        t0 = time.perf_counter()
        with open_arm(arm) as backend:
            backend.create(tasks[0]).close()  # warm: a guest booted, a template checkpointed
            limit = 1 if arm["backend"] == "qemu" else max(PARALLEL)
            results["arms"][arm_name] = {
                n: cell(policy, backend, tasks, protocol, n, args.seconds)
                for n in PARALLEL
                if n <= limit
            }
        print(f"{arm_name}: done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(render(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


def render(results: dict) -> str:
    lines = [
        f"checkpoint {results['checkpoint']} of {results['run']}, {results['tasks']} held-out "
        "tasks; valid rollouts per host-hour with the model (success rate; share of the time "
        "in generation, summed over players)",
        "",
        "| arm | " + " | ".join(f"{n} parallel" for n in PARALLEL) + " |",
        "|---|" + "---:|" * len(PARALLEL),
    ]
    for name, cells in results["arms"].items():
        row = []
        for n in PARALLEL:
            c = cells.get(n)
            if c is None:
                row.append("-")
                continue
            rate = c["success"] / c["valid"] if c["valid"] else 0.0
            row.append(f"{c['per_host_hour']:,.0f} ({rate:.2f}; "
                       f"{c['generation_s'] / c['seconds']:.0%})")  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
