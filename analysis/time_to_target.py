"""Time-to-target per (arm, seed): a pure function of the run's checkpoint and evaluation records.

A checkpoint record (one line of checkpoints.jsonl, written by the trainer) carries the run's
counters at that checkpoint: ``valid_trajectories``, ``invalid_discarded``, ``wall_clock_s``
(training wall-clock since the first step), ``env_cost_usd``, ``inference_cost_usd`` (and the
hours behind them). An evaluation record (eval/<checkpoint>.json) carries the held-out result:
``scored`` (false when too few valid episodes), ``success_rate``, ``successes``, ``episodes``.

The outcome is the first checkpoint, in order of valid trajectories consumed, whose held-out
success rate is at least the threshold (exactly at the threshold counts). Otherwise "never reached
target", with the final held-out rate and the budget spent. A checkpoint before the reaching one
that has no scored evaluation makes the reported time an upper bound: the target might have been
reached there. That is said in the outcome, never hidden.
"""

from __future__ import annotations

COUNTERS = (
    "valid_trajectories",
    "invalid_discarded",
    "wall_clock_s",
    "env_host_hours",
    "env_cost_usd",
    "inference_s",
    "inference_cost_usd",
)


def _scored(evaluation: dict | None) -> bool:
    return bool(evaluation) and evaluation.get("scored", False)


def time_to_target(
    checkpoints: list[dict],
    evaluations: dict[str, dict],
    threshold: float,
    final: dict | None = None,
) -> dict:
    """The outcome of one run. `evaluations` maps checkpoint name -> evaluation record; `final`
    is the run's last counters (the budget spent), defaulting to the last checkpoint's."""
    ordered = sorted(checkpoints, key=lambda c: c["valid_trajectories"])
    unevaluated: list[str] = []
    for checkpoint in ordered:
        evaluation = evaluations.get(checkpoint["checkpoint"])
        if not _scored(evaluation):
            unevaluated.append(checkpoint["checkpoint"])
            continue
        if evaluation["success_rate"] >= threshold:
            return {
                "reached": True,
                "checkpoint": checkpoint["checkpoint"],
                "heldout_success_rate": evaluation["success_rate"],
                "upper_bound": bool(unevaluated),
                "unevaluated_before": unevaluated,
                **{k: checkpoint.get(k) for k in COUNTERS},
            }
    scored = [c for c in ordered if _scored(evaluations.get(c["checkpoint"]))]
    last = scored[-1] if scored else None
    spent = final or (ordered[-1] if ordered else {})
    return {
        "reached": False,
        "verdict": "never reached target",
        "final_checkpoint": last["checkpoint"] if last else None,
        "final_heldout_success_rate": (
            evaluations[last["checkpoint"]]["success_rate"] if last else None
        ),
        "unevaluated": unevaluated,
        "budget_spent": {k: spent.get(k) for k in COUNTERS},
    }
