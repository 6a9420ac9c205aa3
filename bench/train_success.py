"""Training-task success of a finished run's checkpoints, under the frozen evaluation protocol.

    python bench/train_success.py [--arm qemu drums] [--seed 1] [--checkpoint valid-000000 LAST]

The pipeline evaluates held-out tasks only (that is its question). This asks the other one the
trainer issue asks: does GRPO raise success on the tasks it trains on, per arm? Each checkpoint
is played on every training task (results/<exp>/tasks/train.jsonl) exactly as the held-out
evaluation plays its tasks (eval.episodes.evaluate: the frozen target's seeds and episodes per task,
sampled at its temperature, one action each), in-process (LocalBackend: the pixels and checker
every arm shares). LAST is a run's last checkpoint. It also prints whether two arms' checkpoints
are the same files (their digests in checkpoints.jsonl). The experiment is the one
preregistration/target.yaml registers, checked against its freeze receipt.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from envab.envs.tasks.local import LocalBackend
from envab.eval.episodes import Protocol, evaluate
from envab.eval.policy import Policy
from envab.io import read_jsonl
from envab.preregistration import check_frozen
from envab.trainer import agent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", nargs="+", default=["qemu", "drums"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--checkpoint", nargs="+", default=["valid-000000", "LAST"])
    args = p.parse_args(argv)

    prereg = check_frozen("preregistration/target.yaml")
    exp = prereg.experiment_id
    root = Path("results") / exp
    train = list(read_jsonl(root / "tasks/train.jsonl"))
    digests = {}
    played: dict[str, str] = {}  # checkpoint files -> what playing them gave
    for arm in args.arm:
        run = root / arm / f"seed{args.seed}"
        pins = json.loads((run / "pins.json").read_text())
        protocol = Protocol.frozen(prereg.evaluation, pins["training"])
        tools = agent.tool_set(pins["training"]["tools"])
        records = list(read_jsonl(run / "checkpoints.jsonl"))
        digests[arm] = {r["checkpoint"]: r.get("files") for r in records}
        names = [records[-1]["checkpoint"] if c == "LAST" else c for c in args.checkpoint]
        for name in names:
            # Checkpoint files another arm already played (the arms train the same model).
            files = json.dumps(digests[arm].get(name), sort_keys=True)
            if digests[arm].get(name) and files in played:
                print(f"{exp} {arm} seed{args.seed} {name}: {played[files]}", flush=True)
                continue
            t0 = time.perf_counter()
            policy = Policy(run / "checkpoints" / name, tools, protocol.generation)
            result = evaluate(policy, LocalBackend(), train, protocol)
            played[files] = (
                f"training-task success {result['success_rate']:.3f} "
                f"({result['successes']}/{result['episodes']}, {result['invalid']} "
                f"invalid)"
            )
            print(
                f"{exp} {arm} seed{args.seed} {name}: {played[files]} in "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    if len(digests) == 2:
        a, b = digests
        shared = sorted(set(digests[a]) & set(digests[b]))
        same = [c for c in shared if digests[a][c] and digests[a][c] == digests[b][c]]
        print(
            f"checkpoints with identical files on {a} and {b}: {len(same)} of {len(shared)} "
            f"shared ({', '.join(same) or 'none'})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
