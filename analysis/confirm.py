"""The confirmatory evaluation of one run's accepted crossing: fresh seeds, enough episodes.

    python -m envab.analysis.confirm --target T --receipts R... --pins P --checkpoint-records C \
        --evals eval/*.json --checkpoints checkpoints/ --heldout heldout.jsonl \
        --backend '{"backend": "drums", ...}' --out confirm.json [--log L]

The pre-registered crossing rule (target.crossing) picks the checkpoint that reached the target
from the run's held-out evaluations; that checkpoint is evaluated again as the frozen protocol
evaluates every checkpoint (eval/heldout.py), but on evaluation seeds never used before
(confirmation.first_seed onward) and with as many episodes as the exact one-sided binomial test
needs to tell the threshold from threshold - delta (analysis/crossing.py: confirmatory_episodes),
rounded up to whole seeds over the held-out tasks. The verdict is that test's (`confirm`):
"confirmed", or "not confirmed", which is not "below target". A run that never crossed has
nothing to confirm and says so.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from envab import machine_load, preregistration
from envab.analysis.crossing import confirm, confirmation_power, confirmatory_episodes
from envab.analysis.time_to_target import time_to_target
from envab.envs.arms import ArmError, open_arm
from envab.eval.heldout import (
    EpisodeProgress,
    Policy,
    Protocol,
    check_inputs,
    evaluate,
    recorded_files,
)
from envab.io import atomic_write_json, read_jsonl
from envab.progress import job_console
from envab.schema import ConfigError
from envab.trainer import agent
from envab.trainer.guards import GuardError
from envab.trainer.model import ModelPinError


def fresh_seeds(first_seed: int, episodes: int, tasks: int, per_seed: int) -> tuple[int, ...]:
    """Enough fresh evaluation seeds for `episodes` over `tasks` tasks (`per_seed` each)."""
    return tuple(range(first_seed, first_seed + math.ceil(episodes / (tasks * per_seed))))


def confirmation(
    policy, backend, tasks: list[dict], frozen: Protocol, threshold: float, settings, log=None
) -> dict:
    """Play the fresh episodes and judge them: what confirm.json records besides the crossing."""
    wanted = confirmatory_episodes(threshold, settings.delta, settings.alpha, settings.power)
    seeds = fresh_seeds(settings.first_seed, wanted, len(tasks), frozen.episodes_per_task)
    result = evaluate(policy, backend, tasks, replace(frozen, seeds=seeds), log=log)
    judged = confirm(
        result["successes"], result["episodes"], threshold, settings.delta, settings.alpha
    )
    return {
        "verdict": judged.verdict,
        "episodes_wanted": wanted,
        "seeds": list(seeds),
        "test": judged.to_dict(),
        # what this many episodes gives a policy truly at the threshold (exact, not the normal
        # approximation the count was sized by)
        "power_at_threshold": confirmation_power(
            threshold, result["episodes"], threshold, settings.delta, settings.alpha
        ),
        "evaluation": {k: v for k, v in result.items() if k != "episode_records"},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.analysis.confirm", description=__doc__.split("\n")[0]
    )
    preregistration.add_frozen_arguments(parser)
    parser.add_argument("--pins", required=True, help="the run's pins.json")
    parser.add_argument("--checkpoint-records", required=True, help="the run's checkpoints.jsonl")
    parser.add_argument("--evals", nargs="+", required=True, help="the run's eval/<name>.json")
    parser.add_argument("--checkpoints", required=True, help="the run's checkpoints/ folder")
    parser.add_argument("--heldout", required=True, help="heldout.jsonl")
    parser.add_argument("--backend", required=True, help="JSON: the evaluation arm's config")
    parser.add_argument("--out", required=True, help="writes: confirm.json")
    parser.add_argument("--log", help="the job's log; the console then gets its progress")
    args = parser.parse_args(argv)
    run_dir = Path(args.pins).parent
    console = job_console(f"confirm {run_dir.parent.name} {run_dir.name}", args.log)
    try:
        prereg, tasks, pins = check_inputs(args)
        settings = prereg.confirmation
        if settings is None:
            raise ConfigError("the pre-registration has no confirmation section")
        checkpoints = list(read_jsonl(args.checkpoint_records))
        evaluations = {Path(e).stem: json.loads(Path(e).read_text()) for e in args.evals}
        crossing = time_to_target(
            checkpoints, evaluations, prereg.threshold, rule=prereg.target.crossing
        )
        record = {"rule": prereg.target.crossing, "settings": asdict(settings)}
        if not crossing["reached"]:
            record.update(verdict="no crossing to confirm", checkpoint=None)
            atomic_write_json(args.out, record)
            console.say("no accepted crossing: nothing to confirm")
            return 0
        protocol = Protocol.frozen(
            prereg.evaluation, pins["training"]["grpo"]["max_completion_length"]
        )
        checkpoint = Path(args.checkpoints) / crossing["checkpoint"]
        policy = Policy(
            checkpoint,
            agent.tool_set(pins["training"]["tools"]),
            protocol.temperature,
            protocol.max_new_tokens,
            expected=recorded_files(str(checkpoint), args.checkpoint_records),
        )
        wanted = confirmatory_episodes(
            prereg.threshold, settings.delta, settings.alpha, settings.power
        )
        per_seed = len(tasks) * protocol.episodes_per_task
        episodes = per_seed * len(
            fresh_seeds(settings.first_seed, wanted, len(tasks), protocol.episodes_per_task)
        )
        console.say(
            f"{crossing['checkpoint']}: {episodes} fresh episodes ({wanted} wanted) on "
            f"{prereg.evaluation.backend}"
        )
        progress = EpisodeProgress(console, episodes)
        started, snapshot = time.perf_counter(), machine_load.Snapshot.now()
        with open_arm(json.loads(args.backend)) as backend:
            judged = confirmation(
                policy, backend, tasks, protocol, prereg.threshold, settings, progress.episode
            )
        wall = time.perf_counter() - started
    except (ConfigError, GuardError, ModelPinError, ArmError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        console.say(f"error: {e}")
        return 2
    record.update(
        checkpoint=crossing["checkpoint"],
        crossing_success_rate=crossing["heldout_success_rate"],
        **judged,
        wall_s=wall,
        load=machine_load.since(snapshot),
        inference_s=policy.generation_s,
    )
    atomic_write_json(args.out, record)
    test = judged["test"]
    summary = (
        f"{judged['verdict']}: {test['successes']}/{test['episodes']} = "
        f"{test['success_rate']:.3f}, lower bound {test['lower_bound']:.3f} against "
        f"{test['null_rate']:.2f}, {wall:.1f} s"
    )
    print(f"confirm {crossing['checkpoint']}: {summary}", file=sys.stderr)
    console.say(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
