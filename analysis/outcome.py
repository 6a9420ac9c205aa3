"""The experiment's answer, in the form the pre-registration promised.

Inputs, per (arm, seed) run, each file named by one `--run`: pins.json, checkpoints.jsonl, run.json
(the final counters and the stop reason) and eval/<checkpoint>.json (held-out results). Outputs:
outcome.json; outcome.md with, in this order, the coincidence verdict (a gap between the arms'
learning curves is a correctness finding and is shown above any speed result), one row per arm and
seed, the across-seed summary, and cost per valid rollout; the learning-curve figures; the outcome
receipt.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envab import preregistration
from envab.analysis.divergence import first_divergence
from envab.analysis.equivalence import convergence_ratio, curve_equivalence
from envab.analysis.figures import plot_curves
from envab.analysis.runs import RunRecords
from envab.analysis.statistics import coincidence
from envab.analysis.survival import SeedTime, across_seeds
from envab.analysis.time_to_target import time_to_target
from envab.errors import Refusal, refused
from envab.io import atomic_write_json, atomic_write_text
from envab.preregistration import Preregistration
from envab.receipts import subject, write_receipt


class NotComparable(Refusal, ValueError):
    """Runs whose pins differ in something other than the arm and the seed."""


def check_comparable(runs: list[RunRecords]) -> str:
    digests = {r.pins["comparable_sha256"] for r in runs}
    if len(digests) != 1:
        named = ", ".join(f"{r.arm}/seed{r.seed}={r.pins['comparable_sha256'][:12]}" for r in runs)
        raise NotComparable(f"runs are pinned to different things besides the arm: {named}")
    return digests.pop()


def curve(run_list: list[RunRecords]) -> dict[int, dict[str, list[int]]]:
    """Pooled per-task episode outcomes at each checkpoint's due count, over an arm's seeds."""
    pooled: dict[int, dict[str, list[int]]] = {}
    for run in run_list:
        for checkpoint in run.checkpoints:
            evaluation = run.evaluations.get(checkpoint["checkpoint"])
            if not evaluation or not evaluation.get("scored"):
                continue
            at = pooled.setdefault(checkpoint["due_at_valid"], {})
            for task, outcomes in evaluation["tasks"].items():
                at.setdefault(task, []).extend(outcomes)
    return pooled


def seed_curves(run_list: list[RunRecords]) -> dict[int, dict[int, dict[str, list[int]]]]:
    """Per training seed, per checkpoint's due count, per held-out task: episode outcomes."""
    return {run.seed: curve([run]) for run in run_list}


def _row(run: RunRecords, prereg: Preregistration) -> dict:
    result = time_to_target(
        run.checkpoints,
        run.evaluations,
        prereg.threshold,
        final=run.final,
        rule=prereg.target.crossing,
    )
    valid = run.final.get("valid_trajectories") or 0
    env_cost = run.final.get("env_cost_usd") or 0.0
    scored = [e for e in run.evaluations.values() if e.get("scored")]
    at = result["checkpoint"] if result["reached"] else result["final_checkpoint"]
    return {
        "arm": run.arm,
        "seed": run.seed,
        **result,
        "heldout_classes": _classes(run.evaluations.get(at)),
        "load": _measured_load(run.final.get("load"), prereg.prices.host(run.arm)),
        "stop_reason": run.final.get("stop_reason"),
        "cost_per_valid_rollout_usd": env_cost / valid if valid else None,
        "evaluation_wall_s": sum(e.get("wall_s", 0.0) for e in run.evaluations.values()),
        "evaluation_cost_usd": sum(e.get("cost_usd", 0.0) for e in run.evaluations.values()),
        "unscored_evaluations": len(run.evaluations) - len(scored),
        # played for another run's identical checkpoint (eval/reuse.py); the figures above are
        # still what evaluating this run's checkpoints costs
        "reused_evaluations": sum(bool(e.get("reused")) for e in run.evaluations.values()),
        "confirmation": _confirmation(run.confirmation),
    }


def _confirmation(record: dict | None) -> dict | None:
    """The confirmatory evaluation's verdict on the accepted crossing, when one was registered."""
    if record is None:
        return None
    test = record.get("test") or {}
    return {
        "verdict": record["verdict"],
        "checkpoint": record.get("checkpoint"),
        **{k: test.get(k) for k in ("successes", "episodes", "success_rate", "lower_bound")},
        "null_rate": test.get("null_rate"),
    }


def _classes(evaluation: dict | None) -> dict | None:
    """The three outcome classes of held-out episodes at the target (or the last scored
    checkpoint): succeeded, failed but valid, invalid (retried, never scored)."""
    if not evaluation or evaluation.get("successes") is None:
        return None
    successes, episodes = evaluation["successes"], evaluation["episodes"]
    return {
        "success": successes,
        "failed_valid": episodes - successes,
        "invalid": evaluation.get("invalid", 0),
    }


def _measured_load(load: dict | None, host_usd_per_hour: float) -> dict | None:
    """What training used, measured (envab/machine_load.py), and its cost at the host's nominal
    price per core-hour, beside the nominal cost of holding the whole host."""
    if not load:
        return None
    cores = load.get("cores") or 1
    return {
        "cpu_hours": load["cpu_hours"],
        "cpu_cost_usd": load["cpu_hours"] * host_usd_per_hour / cores,
        "machine_busy_fraction": load.get("machine_busy_fraction"),
        "steal_fraction": load.get("steal_fraction"),
        "loadavg_1_5_15": load.get("loadavg_1_5_15"),
    }


def _divergence(by_arm, baseline: str, candidate: str) -> dict:
    """Per seed both arms ran, the first training step whose digests differ (or never)."""
    steps = {arm: {r.seed: r.steps for r in by_arm[arm]} for arm in (baseline, candidate)}
    seeds = sorted(set(steps[baseline]) & set(steps[candidate]))
    per_seed = []
    for seed in seeds:
        a, b = steps[baseline][seed], steps[candidate][seed]
        if a is None or b is None:
            result = {"verdict": "not compared", "reason": "no step digests (steps.jsonl)"}
        else:
            result = first_divergence(a, b)
        per_seed.append({"seed": seed, **result})
    return {"seeds": per_seed}


def _arm_summary(rows: list[dict]) -> dict:
    """How many seeds reached the target; the times themselves are compared across seeds with
    censoring (`across_seeds`), never averaged over the seeds that happened to reach it."""
    reached = sum(r["reached"] for r in rows)
    summary = {"seeds": len(rows), "reached": reached, "censored": len(rows) - reached}
    if len(rows) == 1:
        summary["variance"] = "one seed per arm: a single draw, no claim about variance"
    else:
        summary["variance"] = f"{len(rows)} seeds"
    return summary


def seed_time(row: dict, axis: str) -> SeedTime:
    """One run's time-to-target on `axis` (wall_clock_s or valid_trajectories): at the accepted
    crossing, after its last look below target; or censored at the budget it spent."""
    if row["reached"]:
        before = row["last_look_before"]
        return SeedTime(row["seed"], True, row[axis], before[axis] if before else None)
    return SeedTime(row["seed"], False, row["budget_spent"][axis])


def _across_seeds(rows: list[dict], baseline: str, candidate: str, budget: float) -> dict:
    try:
        return across_seeds(
            [seed_time(r, "wall_clock_s") for r in rows if r["arm"] == baseline],
            [seed_time(r, "wall_clock_s") for r in rows if r["arm"] == candidate],
            budget,
            names=(baseline, candidate),
        )
    except ValueError as e:  # e.g. the target met at the start: no time to compare
        return {"verdict": "not computed", "reason": str(e)}


def _equivalence(by_arm, rows, baseline: str, candidate: str, prereg: Preregistration) -> dict:
    """The pre-registered curve-equivalence test and the valid-trajectories-to-target ratio."""
    settings = prereg.equivalence
    try:
        result = curve_equivalence(
            seed_curves(by_arm[candidate]),
            seed_curves(by_arm[baseline]),
            margin=settings.margin(prereg.threshold),
            samples=settings.bootstrap_samples,
            confidence=settings.confidence,
        ).to_dict()
    except ValueError as e:
        result = {"verdict": "not computed", "reason": str(e)}
    valid = {(r["arm"], r["seed"]): r["valid_trajectories"] if r["reached"] else None for r in rows}
    ratios = []
    for seed in sorted(
        {s for a, s in valid if a == baseline} & {s for a, s in valid if a == candidate}
    ):
        try:
            ratio = convergence_ratio(
                valid[candidate, seed], valid[baseline, seed], settings.convergence_band
            ).to_dict()
        except ValueError as e:
            ratio = {"verdict": "not computed", "reason": str(e)}
        ratios.append({"seed": seed, **ratio})
    return {"curves": result, "convergence_ratio": ratios}


def compute_outcome(runs: list[RunRecords], prereg: Preregistration) -> dict:
    if not runs:
        raise ValueError("no runs to analyse")
    comparable = check_comparable(runs)
    rows = [_row(r, prereg) for r in sorted(runs, key=lambda r: (prereg.arms.index(r.arm), r.seed))]
    arms = [a for a in prereg.arms if any(r.arm == a for r in runs)]
    by_arm = {a: [r for r in runs if r.arm == a] for a in arms}
    checks = []
    baseline = arms[0]
    for candidate in arms[1:]:
        settings = prereg.coincidence
        try:
            result = coincidence(
                curve(by_arm[candidate]),
                curve(by_arm[baseline]),
                margin=settings.margin,
                samples=settings.bootstrap_samples,
                confidence=settings.confidence,
            ).to_dict()
        except ValueError as e:
            result = {"verdict": "not computed", "reason": str(e)}
        checks.append({"candidate": candidate, "baseline": baseline, **result})
    pairs = [(baseline, candidate) for candidate in arms[1:]]
    return {
        "divergence": [
            {"candidate": c, "baseline": b, **_divergence(by_arm, b, c)} for b, c in pairs
        ],
        "experiment_id": prereg.experiment_id,
        "question": prereg.question,
        "target": {"metric": prereg.target.metric, "threshold": prereg.target.threshold},
        "comparable_sha256": comparable,
        "crossing_rule": prereg.target.crossing,
        "coincidence": checks,
        "equivalence": [
            {"candidate": c, "baseline": b, **_equivalence(by_arm, rows, b, c, prereg)}
            for b, c in pairs
        ]
        if prereg.equivalence
        else None,
        "runs": rows,
        "arms": {a: _arm_summary([r for r in rows if r["arm"] == a]) for a in arms},
        "across_seeds": [
            {
                "candidate": c,
                "baseline": b,
                **_across_seeds(rows, b, c, prereg.budget.max_wall_clock_s),
            }
            for b, c in pairs
        ],
        "inputs": {p: d for run in runs for p, d in run.inputs.items()},
    }


def _fmt(value, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


_VERDICT_TEXT = {
    "coincide": "coincide: the learning curves agree within the pre-registered margin",
    "differ": "differ — the environment changed the data (a correctness finding that outranks "
    "any speed result)",
    "inconclusive": "inconclusive: too few held-out episodes to tell at this margin",
}


def _divergence_line(check: dict) -> str:
    parts = []
    for s in check["seeds"]:
        if s["verdict"] == "never":
            n = s["steps_compared"]
            parts.append(
                f"seed {s['seed']}: never diverged over {n} step{'s' if n != 1 else ''} "
                "(identical prompts, images, completions, rewards and advantages)"
            )
        elif s["verdict"] == "diverged":
            parts.append(
                f"seed {s['seed']}: diverged at step {s['step']} ({', '.join(s['fields'])})"
            )
        else:
            parts.append(f"seed {s['seed']}: not compared ({s['reason']})")
    return f"- **{check['candidate']} vs {check['baseline']}**: " + ("; ".join(parts) or "–")


def _rule_text(rule: dict) -> str:
    return ", ".join(f"{k} {v}" if k != "rule" else str(v) for k, v in rule.items())


def _equivalence_line(check: dict) -> str:
    pair = f"{check['candidate']} vs {check['baseline']}"
    curves = check["curves"]
    if "half_width" not in curves:
        return f"- **{pair}: not computed** ({curves.get('reason', '')})"
    ratios = "; ".join(
        f"seed {r['seed']}: {r['verdict']}"
        + (
            f" ({r['ratio']:.2f}, band {r['bounds'][0]:.2f}–{r['bounds'][1]:.2f})"
            if r.get("ratio")
            else ""
        )
        for r in check["convergence_ratio"]
    )
    return (
        f"- **{pair}: {curves['verdict']}.** Largest difference {curves['max_abs_difference']:.3f} "
        f"(at {curves['max_at_valid_trajectories']} valid trajectories); simultaneous band "
        f"±{curves['half_width']:.3f} over {len(curves['matched_valid_trajectories'])} matched "
        f"checkpoints, {curves['heldout_tasks']} held-out tasks; margin ±{curves['margin']:.4f}. "
        f"Valid trajectories to target, {check['candidate']}/{check['baseline']}: {ratios or '–'}."
    )


def _across_seeds_lines(check: dict) -> list[str]:
    pair = f"{check['candidate']} vs {check['baseline']}"
    if "kaplan_meier" not in check:
        return [f"- {pair}: not computed ({check.get('reason', '')})"]
    km = check["kaplan_meier"]
    medians = ", ".join(
        f"{arm} {_fmt(k['median'], ' s')} ({k['censored']} censored)" for arm, k in km.items()
    )
    rmst = check["rmst"]
    ratio = check["paired_log_ratio"]
    interval = (
        f"[{ratio['interval_ratio'][0]:.2f}, {ratio['interval_ratio'][1]:.2f}]"
        if ratio.get("interval_ratio")
        else f"no interval ({ratio.get('interval_reason')})"
    )
    lines = [
        f"- {pair}: Kaplan–Meier median time to target {medians}; log-rank p "
        f"{_fmt(check['logrank']['p_value'], digits=3)}; restricted mean up to the budget "
        + ", ".join(f"{a} {_fmt(v, ' s')}" for a, v in rmst["by_arm"].items())
        + f"; paired time ratio {check['candidate']}/{check['baseline']} "
        f"{_fmt(ratio.get('geometric_mean_ratio'), digits=2)} ({ratio.get('estimate_is')}), "
        f"{interval}.",
        f"- {check['claim']}",
    ]
    return lines


def _confirmation_text(c: dict | None) -> str:
    if c is None:
        return "not registered"
    if c.get("episodes") is None:
        return c["verdict"]
    return (
        f"{c['verdict']}: {c['successes']}/{c['episodes']} fresh = {c['success_rate']:.3f}, "
        f"bound {c['lower_bound']:.3f} vs {c['null_rate']:.2f}"
    )


def render_markdown(outcome: dict) -> str:
    t = outcome["target"]
    lines = [
        f"# Outcome: {outcome['experiment_id']}",
        "",
        f"**Question.** {outcome['question']}",
        "",
        f"**Target.** {t['metric']} ≥ {t['threshold']} (pre-registered), crossed by the rule "
        f"`{_rule_text(outcome['crossing_rule'])}`.",
        "",
        "## Did the arms see the same training data? (exact divergence)",
        "",
    ]
    lines += [_divergence_line(check) for check in outcome["divergence"]] or ["- one arm: –"]
    lines.append("")
    if outcome["equivalence"] is not None:
        lines += ["## Learning curves: equivalent within the margin?", ""]
        lines += [_equivalence_line(check) for check in outcome["equivalence"]]
        lines.append("")
    lines += ["## Learning curves: do the arms coincide?", ""]
    for check in outcome["coincidence"]:
        verdict = _VERDICT_TEXT.get(check["verdict"], check["verdict"])
        detail = (
            f" Difference {check['candidate']} − {check['baseline']}: "
            f"{check['difference']:+.3f}, {len(check['matched_valid_trajectories'])} matched "
            f"checkpoints, interval [{check['interval'][0]:+.3f}, {check['interval'][1]:+.3f}], "
            f"margin ±{check['margin']}."
            if "difference" in check
            else f" ({check.get('reason', '')})"
        )
        lines.append(f"- **{check['candidate']} vs {check['baseline']}: {verdict}.**{detail}")
    if not outcome["coincidence"]:
        lines.append("- one arm: –")
    lines += [
        "",
        "## Time to target",
        "",
        "| arm | seed | outcome | held-out | confirmed? | wall-clock | env cost | inference cost "
        "| valid used | invalid discarded | stop |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in outcome["runs"]:
        if r["reached"]:
            outcome_text = f"reached at {r['checkpoint']}" + (
                " (upper bound)" if r["upper_bound"] else ""
            )
            rate, counters = r["heldout_success_rate"], r
        else:
            outcome_text = "never reached target"
            rate, counters = r["final_heldout_success_rate"], r["budget_spent"]
        lines.append(
            f"| {r['arm']} | {r['seed']} | {outcome_text} | {_fmt(rate, digits=3)} "
            f"| {_confirmation_text(r.get('confirmation'))} "
            f"| {_fmt(counters.get('wall_clock_s'), ' s')} "
            f"| {_fmt(counters.get('env_cost_usd'), ' $', 5)} "
            f"| {_fmt(counters.get('inference_cost_usd'), ' $', 5)} "
            f"| {_fmt(counters.get('valid_trajectories'))} "
            f"| {_fmt(counters.get('invalid_discarded'))} | {r['stop_reason'] or '–'} |"
        )
    lines += ["", "## Across seeds (a seed that never reached the target is censored)", ""]
    for arm, summary in outcome["arms"].items():
        lines.append(
            f"- **{arm}**: reached target in {summary['reached']} of {summary['seeds']} seeds; "
            f"{summary['variance']}."
        )
    for check in outcome["across_seeds"]:
        lines += _across_seeds_lines(check)
    lines += [
        "",
        "## What the machine was doing (measured) and the held-out classes at the target",
        "",
        "| arm | seed | CPU-hours | at core price | machine busy | steal | load avg (1, 5, 15 min) "
        "| succeeded / failed valid / invalid |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in outcome["runs"]:
        load, classes = r["load"] or {}, r["heldout_classes"]
        busy, steal = load.get("machine_busy_fraction"), load.get("steal_fraction")
        lines.append(
            f"| {r['arm']} | {r['seed']} | {_fmt(load.get('cpu_hours'), digits=4)} "
            f"| {_fmt(load.get('cpu_cost_usd'), ' $', 5)} "
            f"| {_fmt(None if busy is None else 100 * busy, ' %')} "
            f"| {_fmt(None if steal is None else 100 * steal, ' %')} "
            f"| {', '.join(f'{x:.2f}' for x in load.get('loadavg_1_5_15') or []) or '–'} "
            f"| {' / '.join(str(v) for v in classes.values()) if classes else '–'} |"
        )
    lines += ["", "## Cost per valid rollout (environment)", ""]
    for r in outcome["runs"]:
        lines.append(
            f"- {r['arm']} seed {r['seed']}: {_fmt(r['cost_per_valid_rollout_usd'], ' $', 7)}; "
            f"held-out evaluation {_fmt(r['evaluation_wall_s'], ' s')}, "
            f"{_fmt(r['evaluation_cost_usd'], ' $', 5)}"
            + (
                f", {r['unscored_evaluations']} checkpoint(s) not scored"
                if r["unscored_evaluations"]
                else ""
            )
            + (
                f", {r['reused_evaluations']} reused from an identical checkpoint"
                if r.get("reused_evaluations")
                else ""
            )
        )
    lines += ["", f"Pins (everything but arm and seed): `{outcome['comparable_sha256']}`", ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m envab.analysis.outcome", description=__doc__)
    # --receipts: what the outcome builds on (the freeze, the warm start), its frozen target's
    # receipt among them; the outcome receipt depends on each.
    preregistration.add_frozen_arguments(parser)
    parser.add_argument(
        "--run",
        dest="runs",
        action="append",
        nargs="+",
        required=True,
        metavar="FILE",
        help="one run, once per run: its pins.json, checkpoints.jsonl and run.json, then its "
        "steps.jsonl (known by its name; optional) and eval/<checkpoint>.json files",
    )
    parser.add_argument("--outcome-json", type=Path, required=True)
    parser.add_argument("--outcome-md", type=Path, required=True)
    parser.add_argument("--curves-valid", type=Path, required=True, help="a PNG to write")
    parser.add_argument("--curves-wallclock", type=Path, required=True, help="a PNG to write")
    parser.add_argument("--receipt", type=Path, required=True, help="receipts/<exp>/outcome.json")
    args = parser.parse_args(argv)
    for files in args.runs:
        if len(files) < 3:
            parser.error(f"--run {' '.join(files)}: give pins.json, checkpoints.jsonl, run.json")
    return args


BY_NAME = ("steps.jsonl", "trajectories.jsonl", "confirm.json")


def load_run(files: list[str]) -> RunRecords:
    """One --run group: three files in order, then steps.jsonl, trajectories.jsonl and
    confirm.json known by their names (each optional), and the evaluations."""
    pins, checkpoints, run, *rest = files
    named = {Path(f).name: f for f in rest if Path(f).name in BY_NAME}
    evaluations = [f for f in rest if Path(f).name not in BY_NAME]
    return RunRecords.load(
        pins,
        checkpoints,
        run,
        evaluations,
        named.get("steps.jsonl"),
        named.get("trajectories.jsonl"),
        named.get("confirm.json"),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        prereg, receipts = preregistration.frozen_inputs(args)
        runs = [load_run(files) for files in args.runs]
        outcome = compute_outcome(runs, prereg)
    # A record that is not JSON is a ValueError too.
    except (Refusal, FileNotFoundError, ValueError) as e:
        return refused(e)
    figures = [
        plot_curves(runs, prereg.threshold, args.curves_valid, "valid"),
        plot_curves(runs, prereg.threshold, args.curves_wallclock, "wallclock"),
    ]
    atomic_write_json(args.outcome_json, outcome)
    atomic_write_text(args.outcome_md, render_markdown(outcome))
    write_receipt(
        args.receipt,
        "outcome",
        subjects=[subject(args.outcome_json), subject(args.outcome_md)]
        + [subject(f) for f in figures]
        + [subject(p, d) for p, d in sorted(outcome["inputs"].items())],
        predicate={
            "experiment_id": outcome["experiment_id"],
            "divergence": {
                f"{c['candidate']}/seed{s['seed']}": s["verdict"]
                for c in outcome["divergence"]
                for s in c["seeds"]
            },
            "coincidence": [c["verdict"] for c in outcome["coincidence"]],
            "reached": {f"{r['arm']}/seed{r['seed']}": r["reached"] for r in outcome["runs"]},
        },
        depends_on=receipts.paths,
    )
    print(args.outcome_md.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
