"""The confirmatory evaluation of one run's accepted crossing: fresh seeds, enough episodes.

    python -m envab.analysis.confirm --target T --receipts R... --pins P --checkpoint-records C \
        --evals eval/*.json --checkpoints checkpoints/ --heldout heldout.jsonl \
        --backend '{"backend": "drums", ...}' --out confirm.json [--log L]

The pre-registered crossing rule (target.crossing) picks the checkpoint that reached the target
from the run's held-out evaluations; that checkpoint is evaluated again as the frozen protocol
evaluates every checkpoint (eval/heldout.py), but on evaluation seeds never used before
(confirmation.first_seed onward) and with whole seeds' worth of episodes (held-out tasks x
episodes per task each), as few as give the exact one-sided binomial test the registered power at
the number played (analysis/crossing.py: confirmatory_episodes). Its null is the registered one
(confirmation.null_at: threshold - delta, or the threshold itself), stated in the record. The
verdict is that test's (`confirm`): "confirmed", or "not confirmed", and a crossing that is not
confirmed is not reached anywhere downstream (analysis/time_to_target.py). A run that never
crossed has nothing to confirm and says so.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

from envab import preregistration
from envab.analysis.crossing import (
    confirm,
    confirmation_power,
    confirmation_rates,
    confirmatory_episodes,
    null_statement,
)
from envab.analysis.time_to_target import time_to_target
from envab.envs.arms import files_beside
from envab.errors import Refusal, refused
from envab.eval import workers
from envab.eval.episodes import Protocol
from envab.eval.heldout import check_inputs, checked_key, play_checkpoint
from envab.eval.reuse import Store, evaluated_once
from envab.io import atomic_write_json, read_jsonl
from envab.progress import job_console
from envab.schema import ConfigError

REUSE_FIELDS = ("evaluation_key", "evaluated_for", "reused")  # eval/reuse.py


def fresh_seeds(first_seed: int, episodes: int, tasks: int, per_seed: int) -> tuple[int, ...]:
    """Enough fresh evaluation seeds for `episodes` over `tasks` tasks (`per_seed` each)."""
    return tuple(range(first_seed, first_seed + math.ceil(episodes / (tasks * per_seed))))


def fresh_protocol(
    frozen: Protocol, tasks: int, threshold: float, settings
) -> tuple[Protocol, int]:
    """The frozen protocol on fresh seeds, enough of them for the episodes the test wants; and
    how many it wants (a whole number of seeds: the exact power is checked at the n played)."""
    per_seed = tasks * frozen.episodes_per_task
    wanted = confirmatory_episodes(
        threshold, settings.delta, settings.alpha, settings.power, per_seed, _null(settings)
    )
    seeds = fresh_seeds(settings.first_seed, wanted, tasks, frozen.episodes_per_task)
    return replace(frozen, seeds=seeds), wanted


def _null(settings) -> str:
    # experiments registered before confirmation.null_at existed tested threshold - delta
    return getattr(settings, "null_at", "threshold_minus_delta")


def confirmation(result: dict, threshold: float, wanted: int, seeds, settings) -> dict:
    """Judge the fresh episodes: what confirm.json records besides the crossing."""
    null = _null(settings)
    judged = confirm(
        result["successes"], result["episodes"], threshold, settings.delta, settings.alpha, null
    )
    _, alternative = confirmation_rates(threshold, settings.delta, null)
    return {
        "verdict": judged.verdict,
        "episodes_wanted": wanted,
        "seeds": list(seeds),
        "test": judged.to_dict(),
        "null": null_statement(threshold, settings.delta, null),
        # the exact power at the episodes actually played (invalid episodes that ran out of
        # retries can leave fewer than wanted)
        "power": confirmation_power(
            alternative, result["episodes"], threshold, settings.delta, settings.alpha, null
        ),
        "evaluation": {
            k: v
            for k, v in result.items()
            if k not in ("episode_records", "wall_s", "load", "inference_s", *REUSE_FIELDS)
        },
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
    parser.add_argument(
        "--store", help="evaluations by key (results/<exp>/evaluations): reused, then kept"
    )
    parser.add_argument("--log", help="the job's log; the console then gets its progress")
    workers.add_cores_argument(parser)
    workers.add_host_log_argument(parser)
    args = parser.parse_args(argv)
    run_dir = Path(args.pins).parent
    console = job_console(f"confirm {run_dir.parent.name} {run_dir.name}", args.log)
    try:
        prereg, tasks, pins, receipts = check_inputs(args)
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
        frozen = Protocol.frozen(prereg.evaluation, pins.training)
        protocol, wanted = fresh_protocol(frozen, len(tasks), prereg.threshold, settings)
        checkpoint = Path(args.checkpoints) / crossing["checkpoint"]
        backend = json.loads(args.backend)
        key = checked_key(
            checkpoint, args.checkpoint_records, protocol, pins, backend, args.heldout, receipts
        )
        console.say(f"{crossing['checkpoint']}: {wanted} fresh episodes wanted")
        result = evaluated_once(
            Store(args.store) if args.store else None,
            key,
            lambda: play_checkpoint(
                checkpoint,
                pins,
                protocol,
                tasks,
                backend,
                console,
                f"fresh episodes on {prereg.evaluation.backend}",
                receipts,
                files_beside(args.heldout),  # the files its tasks download, as frozen
                args.cores,
                workers.host_log_of(args),
            ),
            evaluated_for=f"{run_dir.parent.name}/{run_dir.name}/confirm",
        )
        judged = confirmation(result, prereg.threshold, wanted, protocol.seeds, settings)
    except (Refusal, FileNotFoundError) as e:
        return refused(e, console)
    record.update(
        checkpoint=crossing["checkpoint"],
        crossing_success_rate=crossing["heldout_success_rate"],
        **judged,
        wall_s=result["wall_s"],
        load=result["load"],
        inference_s=result["inference_s"],
        **{k: result[k] for k in REUSE_FIELDS},
    )
    atomic_write_json(args.out, record)
    test = judged["test"]
    summary = (
        f"{judged['verdict']}: {test['successes']}/{test['episodes']} = "
        f"{test['success_rate']:.3f}, lower bound {test['lower_bound']:.3f} against "
        f"{test['null_rate']:.2f}, {result['wall_s']:.1f} s"
    )
    if result["reused"]:
        summary += f", reused: played for {result['evaluated_for']}"
    print(f"confirm {crossing['checkpoint']}: {summary}", file=sys.stderr)
    console.say(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
