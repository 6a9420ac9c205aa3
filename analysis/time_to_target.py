"""Time-to-target per (arm, seed): a pure function of the run's checkpoint and evaluation records.

A checkpoint record (one line of checkpoints.jsonl, written by the trainer) carries the run's
counters at that checkpoint: ``valid_trajectories``, ``invalid_discarded``, ``wall_clock_s``
(training wall-clock since the first step), ``env_cost_usd``, ``inference_cost_usd`` (and the
hours behind them). An evaluation record (eval/<checkpoint>.json) carries the held-out result:
``scored`` (false when too few valid episodes), ``success_rate``, ``successes``, ``episodes``.

The outcome is the checkpoint the pre-registered crossing rule accepts (analysis/crossing.py), in
order of valid trajectories consumed; under the old first_crossing rule, the first whose held-out
success rate is at least the threshold (exactly at the threshold counts). Otherwise "never reached
target", with the final held-out rate and the budget spent. A checkpoint before the reaching one
that has no scored evaluation makes the reported time an upper bound: the target might have been
reached there. That is said in the outcome, never hidden.

Where a confirmation is registered, a crossing counts only when its confirmatory evaluation
(analysis/confirm.py) confirmed it: a crossing that is not confirmed (or whose confirmation is
missing, or judged another checkpoint) is "never reached target", censored at the budget like any
other run that never reached it, so no statistic downstream (the outcome's rows, Kaplan–Meier,
log-rank, RMST, the paired ratio, the receipt, the controls) can count it. The crossing is kept
in the record as `unconfirmed_crossing`.
"""

from __future__ import annotations

from envab.analysis.crossing import accepted_crossing

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
    rule: dict | None = None,
    confirmation: dict | None = None,
    confirmation_registered: bool = False,
) -> dict:
    """The outcome of one run. `evaluations` maps checkpoint name -> evaluation record; `final`
    is the run's last counters (the budget spent), defaulting to the last checkpoint's; `rule` is
    the pre-registered crossing rule (target.crossing; analysis/crossing.py), first_crossing when
    not given. A reached run also names the last scored checkpoint before its crossing: the
    target was reached after it, so the time lies between the two (interval censoring).
    `confirmation_registered`: the pre-registration has a confirmation, so the crossing counts
    only when `confirmation` (the run's confirm.json) confirmed that very checkpoint."""
    rule = rule or {"rule": "first_crossing"}
    ordered = sorted(checkpoints, key=lambda c: c["valid_trajectories"])
    looks = [evaluations.get(c["checkpoint"]) for c in ordered]
    index = accepted_crossing(looks, threshold, rule)
    unconfirmed = None
    if index is not None and confirmation_registered:
        why = _not_confirmed(confirmation, ordered[index]["checkpoint"])
        if why:
            unconfirmed = {
                "checkpoint": ordered[index]["checkpoint"],
                "heldout_success_rate": looks[index]["success_rate"],
                "reason": why,
            }
            index = None
    if index is not None:
        checkpoint, evaluation = ordered[index], looks[index]
        prior = list(zip(ordered[:index], looks[:index], strict=True))
        before = [c for c, e in prior if _scored(e)]
        unevaluated = [c["checkpoint"] for c, e in prior if not _scored(e)]
        return {
            "reached": True,
            "rule": rule,
            "checkpoint": checkpoint["checkpoint"],
            "heldout_success_rate": evaluation["success_rate"],
            "upper_bound": bool(unevaluated),
            "unevaluated_before": unevaluated,
            "last_look_before": (
                {k: before[-1].get(k) for k in ("checkpoint", *COUNTERS)} if before else None
            ),
            **{k: checkpoint.get(k) for k in COUNTERS},
        }
    unevaluated = [c["checkpoint"] for c, e in zip(ordered, looks, strict=True) if not _scored(e)]
    scored = [c for c, e in zip(ordered, looks, strict=True) if _scored(e)]
    last = scored[-1] if scored else None
    spent = final or (ordered[-1] if ordered else {})
    return {
        "reached": False,
        "rule": rule,
        "verdict": "never reached target",
        "unconfirmed_crossing": unconfirmed,
        "final_checkpoint": last["checkpoint"] if last else None,
        "final_heldout_success_rate": (
            evaluations[last["checkpoint"]]["success_rate"] if last else None
        ),
        "unevaluated": unevaluated,
        "budget_spent": {k: spent.get(k) for k in COUNTERS},
    }


def _not_confirmed(confirmation: dict | None, checkpoint: str) -> str | None:
    """Why an accepted crossing does not count, or None when its confirmation confirmed it."""
    if confirmation is None:
        return "no confirmatory evaluation"
    if confirmation.get("checkpoint") != checkpoint:
        return f"the confirmation judged {confirmation.get('checkpoint')}, not this crossing"
    if confirmation.get("verdict") != "confirmed":
        return f"crossing {confirmation.get('verdict', 'not confirmed')}"
    return None
