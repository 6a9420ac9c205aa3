"""The experiment's answer, in the form the pre-registration promised.

Inputs, per (arm, seed) run, each file named by one `--run`: pins.json, checkpoints.jsonl, run.json
(the final counters and the stop reason) and eval/<checkpoint>.json (held-out results), with
confirm.json where a confirmation is registered and trajectories.jsonl for each run's reward
consistency (secondary, descriptive: analysis/reward_consistency.py). Outputs: outcome.json;
outcome.md with, in this order, the pre-registered primary endpoint (target.yaml:
primary_endpoint), exact divergence and the curve checks (a gap between the arms' learning curves
is a correctness finding that outranks any speed result), one row per arm and seed, the
across-seed summary with the secondary endpoints (Holm-adjusted), cost per valid rollout and each
run's reward consistency; the learning-curve figures; the outcome receipt.

A crossing that is not confirmed is not reached (analysis/time_to_target.py); a never-reached run
is censored at the budget by every statistic (analysis/survival.py). With one seed per arm there
is no replication: no test is run, the curve checks make no arm-level claim, and the outcome shows
exact divergence as the only evidence about the curves.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from statsmodels.stats.multitest import multipletests

from envab import preregistration
from envab.analysis import speed, trace_replay
from envab.analysis.crossing import null_statement
from envab.analysis.divergence import first_divergence
from envab.analysis.equivalence import convergence_ratio, curve_equivalence
from envab.analysis.figures import plot_curves
from envab.analysis.reward_consistency import consistency
from envab.analysis.runs import RunRecords
from envab.analysis.statistics import coincidence
from envab.analysis.survival import (
    MIN_FOR_TEST,
    NO_REPLICATION,
    SeedTime,
    across_seeds,
    at_budget,
    logrank,
    paired_t,
)
from envab.analysis.time_to_target import time_to_target
from envab.errors import Refusal, refused
from envab.io import atomic_write_json, atomic_write_text, read_jsonl
from envab.machine import describe
from envab.preregistration import Preregistration, PrimaryEndpoint
from envab.receipts import subject, write_receipt


class NotComparable(Refusal, ValueError):
    """Runs whose pins differ in something other than the arm and the seed."""


def check_comparable(runs: list[RunRecords]) -> str:
    digests = {r.pins.comparable_sha256 for r in runs}
    if len(digests) != 1:
        named = ", ".join(f"{r.arm}/seed{r.seed}={r.pins.comparable_sha256[:12]}" for r in runs)
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
        confirmation=run.confirmation,
        confirmation_registered=getattr(prereg, "confirmation", None) is not None,
    )
    valid = run.final.get("valid_trajectories") or 0
    env_cost = run.final.get("env_cost_usd") or 0.0
    scored = [e for e in run.evaluations.values() if e.get("scored")]
    at = result["checkpoint"] if result["reached"] else result["final_checkpoint"]
    return {
        "arm": run.arm,
        "seed": run.seed,
        **result,
        "warm_start_rate": warm_start_rate(run),
        "clocks": clocks(run.final, prereg.prices.host(run.arm)),
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
        "confirmation": _confirmation(
            run.confirmation, getattr(prereg, "confirmation", None) is not None
        ),
        # secondary, descriptive: same task, same actions, same reward? (a flaky verifier shows)
        "reward_consistency": consistency(run.trajectories),
    }


def warm_start_rate(run: RunRecords) -> float | None:
    """The held-out success of the run's starting checkpoint (valid 0), None if not scored."""
    for checkpoint in run.checkpoints:
        evaluation = run.evaluations.get(checkpoint["checkpoint"])
        if checkpoint["valid_trajectories"] == 0 and evaluation and evaluation.get("scored"):
            outcomes = [o for episodes in evaluation["tasks"].values() for o in episodes]
            return sum(outcomes) / len(outcomes) if outcomes else None
    return None


def clocks(final: dict, host_usd_per_hour: float) -> dict:
    """The run's three clocks: the training loop (from its first step); the environments'
    provisioning plus training (the arm opened to the arm closed, the judging's pauses left out);
    and everything to the run's stop, the judging included. Host cost is charged over the pauses
    too: the host is held while the judge plays."""
    loop = final.get("wall_clock_s")
    held = (final.get("load") or {}).get("wall_s")
    paused = final.get("paused_s") or 0.0
    return {
        "training_loop_s": loop,
        "provisioned_s": held - paused if held is not None else None,
        "with_judging_s": held,
        "host_usd_held": host_usd_per_hour * held / 3600 if held is not None else None,
    }


def warm_start(rows: list[dict], threshold: float) -> dict:
    """The registered rule for a target that needs learning: where a run's warm start already
    meets the threshold on the held-out tasks, time to target measures no learning and the
    outcome says "uninformative"."""
    rates = [r["warm_start_rate"] for r in rows if r["warm_start_rate"] is not None]
    return {
        "rates": rates,
        "threshold": threshold,
        "uninformative": any(rate >= threshold for rate in rates),
    }


def _confirmation(record: dict | None, registered: bool) -> dict | None:
    """The confirmatory evaluation's verdict on the accepted crossing, when one was registered,
    with its null in words (what "confirmed" rules out). A registered one with no record says
    so: the run's crossing is not counted (crossing.py), and its row must not read "not
    registered"."""
    if record is None:
        return {"verdict": "no confirmatory evaluation"} if registered else None
    test = record.get("test") or {}
    return {
        "verdict": record["verdict"],
        "checkpoint": record.get("checkpoint"),
        **{k: test.get(k) for k in ("successes", "episodes", "success_rate", "lower_bound")},
        "null_rate": test.get("null_rate"),
        "null": record.get("null"),
        "power": record.get("power"),
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


def machine_kind_text(run: RunRecords) -> str | None:
    """The machine kind a run trained on, as run.json records it, in words; None for a run that
    recorded none."""
    machine = run.final.get("machine")
    return describe(machine) if machine else None


def _divergence(by_arm, baseline: str, candidate: str) -> dict:
    """Per seed both arms ran, the first training step whose digests differ (or never). Bits
    repeat only within one machine kind, so a seed whose two runs trained on different kinds
    says so: its divergence is expected from the arithmetic alone."""
    runs = {arm: {r.seed: r for r in by_arm[arm]} for arm in (baseline, candidate)}
    seeds = sorted(set(runs[baseline]) & set(runs[candidate]))
    per_seed = []
    for seed in seeds:
        a, b = runs[baseline][seed], runs[candidate][seed]
        if a.steps is None or b.steps is None:
            result = {"verdict": "not compared", "reason": "no step digests (steps.jsonl)"}
        else:
            result = first_divergence(a.steps, b.steps)
        kinds = {"baseline": machine_kind_text(a), "candidate": machine_kind_text(b)}
        if None not in kinds.values() and kinds["baseline"] != kinds["candidate"]:
            result["machine_kinds_differ"] = kinds
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


def seed_time(row: dict, axis: str, budget: float) -> SeedTime:
    """One run's time-to-target on `axis` (wall_clock_s or valid_trajectories): at the accepted
    (and, where registered, confirmed) crossing, after its last look below target; or censored at
    `budget`, the registered budget in that unit, whatever the run spent (one rule for every
    statistic: analysis/survival.py, at_budget)."""
    if row["reached"]:
        before = row["last_look_before"]
        return at_budget(
            SeedTime(row["seed"], True, row[axis], before[axis] if before else None), budget
        )
    return SeedTime(row["seed"], False, float(budget))


#: The registered budget of each unit time-to-target is analysed in.
UNITS = {"wall_clock_s": "max_wall_clock_s", "valid_trajectories": "max_valid_trajectories"}


def _times(rows: list[dict], arm: str, axis: str, prereg: Preregistration) -> list[SeedTime]:
    budget = getattr(prereg.budget, UNITS[axis])
    return [seed_time(r, axis, budget) for r in rows if r["arm"] == arm]


def _across_seeds(rows: list[dict], baseline: str, candidate: str, prereg) -> dict:
    try:
        return across_seeds(
            _times(rows, baseline, "wall_clock_s", prereg),
            _times(rows, candidate, "wall_clock_s", prereg),
            prereg.budget.max_wall_clock_s,
            names=(baseline, candidate),
        )
    except ValueError as e:  # e.g. the target met at the start: no time to compare
        return {"verdict": "not computed", "reason": str(e)}


def _tests(rows: list[dict], baseline: str, candidate: str, prereg) -> dict:
    """Every registered test of time-to-target for one pair, by name: the log-rank and the
    paired t-test on the log ratio, in wall-clock ("faster") and in valid trajectories (the
    trajectory budget, the unit "cheaper" in environment work is counted in)."""
    tests = {}
    for axis in UNITS:
        budget = getattr(prereg.budget, UNITS[axis])
        try:  # a time it cannot take (a crossing at the warm start's look, 0 s): not tested
            a, b = _times(rows, baseline, axis, prereg), _times(rows, candidate, axis, prereg)
            replicated = min(len(a), len(b)) >= MIN_FOR_TEST
            tests[f"paired_time_ratio:{axis}"] = paired_t(a, b, budget)
            tests[f"logrank:{axis}"] = (
                logrank(a, b)
                if replicated
                else {"test": "log-rank", "p_value": None, "reason": NO_REPLICATION}
            )
        except ValueError as e:
            tests[f"paired_time_ratio:{axis}"] = {"p_value": None, "reason": str(e)}
            tests[f"logrank:{axis}"] = {"p_value": None, "reason": str(e)}
    return tests


def _direction(test: dict, key: str, candidate: str) -> str:
    below = (test.get(key) or 0) < 0
    return f"{candidate} faster" if below else f"{candidate} slower"


def _primary(
    tests: dict, across: dict, baseline: str, candidate: str, primary: PrimaryEndpoint
) -> dict:
    """The pre-registered primary endpoint for one pair, with its verdict at its alpha."""
    name = f"{primary.endpoint}:wall_clock_s"
    test = tests[name]
    record = {
        "candidate": candidate,
        "baseline": baseline,
        "endpoint": name,
        "alpha": primary.alpha,
        **test,
    }
    if test.get("p_value") is None:
        reason = test.get("reason") or "no p-value"
        record["verdict"] = NO_REPLICATION if NO_REPLICATION in reason else f"not tested: {reason}"
    elif test["p_value"] > primary.alpha:
        record["verdict"] = f"no difference shown at alpha {primary.alpha:g}"
    elif primary.endpoint == "paired_time_ratio":
        record["verdict"] = _direction(test, "mean_log_ratio", candidate)
    else:  # log-rank: its direction is the restricted means'
        rmst = (across.get("rmst") or {}).get("difference_b_minus_a")
        record["verdict"] = _direction({"d": rmst}, "d", candidate)
    return record


def _secondary(tests_by_pair: dict, primary: PrimaryEndpoint) -> list[dict]:
    """Every other test, one family over all pairs, Holm-adjusted (statsmodels multipletests)
    at the primary's alpha; a test without a p-value is listed, outside the family."""
    family = []
    for (baseline, candidate), tests in tests_by_pair.items():
        for name, test in tests.items():
            if name == f"{primary.endpoint}:wall_clock_s":
                continue
            family.append(
                {
                    "candidate": candidate,
                    "baseline": baseline,
                    "endpoint": name,
                    "p_value": test.get("p_value"),
                    "reason": test.get("reason"),
                    "no_spread": test.get("no_spread"),
                }
            )
    tested = [f for f in family if f["p_value"] is not None]
    if tested:
        reject, adjusted, _, _ = multipletests(
            [f["p_value"] for f in tested], alpha=primary.alpha, method="holm"
        )
        for f, r, q in zip(tested, reject, adjusted, strict=True):
            f.update(p_holm=float(q), significant=bool(r))
    return family


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
    if min(len(by_arm[baseline]), len(by_arm[candidate])) < MIN_FOR_TEST:
        # resampling seeds is a no-op with one each: the band would be evaluation noise only
        result["claim"] = NO_REPLICATION
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


def _historical(prereg) -> str:
    """What the old coincidence check is now: a labelled comparison, never the curve verdict
    (a mean difference over checkpoints, against a margin the equivalence test's rule, a
    fraction below 1 of the gain the target asks for, may refuse)."""
    text = "historical comparison, not a verdict, and not in the outcome receipt"
    equivalence = getattr(prereg, "equivalence", None)
    if equivalence is not None:
        gain = prereg.threshold - equivalence.reference_start
        if prereg.coincidence.margin >= gain:
            text += (
                f": its margin {prereg.coincidence.margin:g} is not below the gain the target "
                f"asks for ({gain:g}), which the margin rule refuses"
            )
    return text


def compute_outcome(
    runs: list[RunRecords], prereg: Preregistration, timing: list[dict] | None = None
) -> dict:
    """The outcome of `runs`; with the registered timing blocks' executions (`timing`), the
    speed section, and the primary endpoint from it where the registration says so."""
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
        result["historical"] = _historical(prereg)
        checks.append({"candidate": candidate, "baseline": baseline, **result})
    pairs = [(baseline, candidate) for candidate in arms[1:]]
    primary = getattr(prereg, "primary", None) or PrimaryEndpoint("paired_time_ratio", 0.05)
    across = {(b, c): _across_seeds(rows, b, c, prereg) for b, c in pairs}
    tests = {(b, c): _tests(rows, b, c, prereg) for b, c in pairs}
    confirmation = getattr(prereg, "confirmation", None)
    measured = (
        speed.section(
            timing,
            pairs,
            primary.alpha,
            primary.smallest_effect,
            getattr(prereg, "timed_controls", ()),
            prereg.timing.aa_rule if getattr(prereg, "timing", None) else "covers_one",
        )
        if timing is not None
        else None
    )
    if primary.endpoint == "seconds_per_valid_trajectory":
        primaries = (
            [speed.primary(pair) for pair in measured["pairs"]]
            if measured is not None
            else [speed.not_measured(b, c, primary) for b, c in pairs]
        )
    else:
        primaries = [_primary(tests[b, c], across[b, c], b, c, primary) for b, c in pairs]
    return {
        "primary": primaries,
        "speed": measured,
        "secondary": _secondary(tests, primary),
        "confirmation_null": (
            null_statement(
                prereg.threshold,
                confirmation.delta,
                getattr(confirmation, "null_at", "threshold_minus_delta"),
            )
            if confirmation
            else None
        ),
        "divergence": [
            {"candidate": c, "baseline": b, **_divergence(by_arm, b, c)} for b, c in pairs
        ],
        # every kind the runs trained on, in the order of the runs (None: not recorded)
        "machine_kinds": list(dict.fromkeys(machine_kind_text(r) for r in runs)),
        "experiment_id": prereg.experiment_id,
        # budget.stop_at_target: each run stopped once its fate was decided, its curve ends there
        "stop_at_target": getattr(prereg.budget, "stop_at_target", False),
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
        "warm_start": warm_start(rows, prereg.threshold),
        "arms": {a: _arm_summary([r for r in rows if r["arm"] == a]) for a in arms},
        "across_seeds": [{"candidate": c, "baseline": b, **across[b, c]} for b, c in pairs],
        "inputs": {p: d for run in runs for p, d in run.inputs.items()},
        # the registered cross-arm trace replays, one per A/B run (a key only where registered)
        **({"replay": replayed} if (replayed := trace_replay.section(runs)) else {}),
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
        if "machine_kinds_differ" in s:
            kinds = s["machine_kinds_differ"]
            parts[-1] += (
                f"; the runs trained on different machine kinds ({check['baseline']}: "
                f"{kinds['baseline']}; {check['candidate']}: {kinds['candidate']})"
            )
            if s["verdict"] == "diverged":
                parts[-1] += (
                    ", whose sums differ: this divergence is expected from that alone and is no "
                    "evidence about the environments"
                )
    return f"- **{check['candidate']} vs {check['baseline']}**: " + ("; ".join(parts) or "–")


def _replicated(outcome: dict, check: dict) -> bool:
    """Both arms of the pair ran at least two seeds (a unit of replication)."""
    arms = outcome["arms"]
    return min(arms[check["candidate"]]["seeds"], arms[check["baseline"]]["seeds"]) >= MIN_FOR_TEST


def _rule_text(rule: dict) -> str:
    return ", ".join(f"{k} {v}" if k != "rule" else str(v) for k, v in rule.items())


def _equivalence_line(check: dict) -> str:
    pair = f"{check['candidate']} vs {check['baseline']}"
    curves = check["curves"]
    if curves.get("claim") == NO_REPLICATION:
        return (
            f"- **{pair}: {NO_REPLICATION}.** The band would be evaluation noise only; exact "
            "divergence (above) is the only evidence about the curves."
        )
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
    if not check.get("replicated", True):
        times = ", ".join(
            f"{arm} {_fmt(row['time'], ' s')}"
            + ("" if row["not_reached"] == 0 else " (censored at the budget)")
            for arm, k in km.items()
            for row in k["table"][-1:]
        )
        return [f"- {pair}: {NO_REPLICATION}; no test is run. Time to target: {times}."]
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


def _primary_line(p: dict) -> str:
    pair = f"{p['candidate']} vs {p['baseline']}"
    if p["endpoint"].startswith("seconds_per_valid_trajectory"):
        what = (
            f"seconds per valid trajectory {p['candidate']}/{p['baseline']} in "
            f"{p['blocks']} timing blocks (training loop, two-sided t-test on the blocks' log "
            f"ratios, alpha {p['alpha']:g}; smallest effect of interest {p['smallest_effect']:g})"
        )
    elif p["endpoint"].startswith("paired_time_ratio"):
        what = (
            f"paired time ratio {p['candidate']}/{p['baseline']} (wall-clock, two-sided paired "
            f"t-test on the log ratio, alpha {p['alpha']:g})"
        )
    else:
        what = f"log-rank test of wall-clock time to target (alpha {p['alpha']:g})"
    line = f"- **{pair}: {p['verdict']}.** {what}"
    if p.get("p_value") is not None:
        line += f": p = {p['p_value']:.3g}"
        if p.get("ratio") is not None:
            line += f", ratio {p['ratio']:.3g}"
        if p.get("interval_ratio"):
            low, high = p["interval_ratio"]
            line += f", 95 % t interval [{low:.3g}, {high:.3g}]"
        if p.get("no_spread"):
            line += f" ({p['no_spread']})"
    return line + "."


def _secondary_lines(secondary: list[dict]) -> list[str]:
    tested = [f for f in secondary if f["p_value"] is not None]
    lines = [
        f"## Secondary endpoints (Holm's rule over {len(tested)} p-value(s))",
        "",
    ]
    for f in secondary:
        pair = f"{f['candidate']} vs {f['baseline']}"
        if f["p_value"] is None:
            lines.append(f"- {pair}, {f['endpoint']}: not tested ({f['reason']})")
        else:
            lines.append(
                f"- {pair}, {f['endpoint']}: p {f['p_value']:.3g}, Holm-adjusted "
                f"{f['p_holm']:.3g}"
                + (" (significant)" if f["significant"] else "")
                + (f" ({f['no_spread']})" if f.get("no_spread") else "")
            )
    return lines or ["- –"]


def _consistency_lines(rows: list[dict]) -> list[str]:
    """Each run's reward consistency: descriptive, no test (analysis/reward_consistency.py)."""
    lines = [
        "",
        "## Reward consistency (secondary, descriptive)",
        "",
        "In a deterministic environment valid attempts at one task with the same actions get the "
        "same reward; a group that disagrees points at a flaky verifier or environment.",
        "",
    ]
    for r in rows:
        c = r.get("reward_consistency") or {}
        if "comparable_groups" not in c:
            text = f"not checked ({c.get('reason', 'no trajectories.jsonl')})"
        else:
            text = (
                f"{c['disagreeing_groups']} of {c['comparable_groups']} comparable groups "
                f"disagree ({c['comparable_attempts']} of {c['valid_attempts']} valid attempts "
                "in a comparable group)"
            )
            if c["examples"]:
                e = c["examples"][0]
                text += f", e.g. {e['task_id']}: rewards {e['rewards']}"
        lines.append(f"- {r['arm']} seed {r['seed']}: {text}")
    return lines


def _clock_lines(rows: list[dict]) -> list[str]:
    """Each run's three clocks, and each arm's total on each against the first arm's."""
    lines = [
        "## Three clocks",
        "",
        "What each run spent: the training loop (what `wall-clock` below counts); the "
        "environments' provisioning plus training (the arm opened to the arm closed, the "
        "judging's pauses left out); and everything to the stop, the judging included, with the "
        "host's cost over all of it (it is held while the judge plays).",
        "",
        "| arm | seed | training loop s | provisioning + training s | with judging s "
        "| host cost held |",
        "|---|---|---|---|---|---|",
    ]
    totals: dict[str, list[float]] = {}
    for r in rows:
        c = r.get("clocks") or {}
        lines.append(
            f"| {r['arm']} | {r['seed']} | {_fmt(c.get('training_loop_s'))} | "
            f"{_fmt(c.get('provisioned_s'))} | {_fmt(c.get('with_judging_s'))} | "
            f"{_fmt(c.get('host_usd_held'), digits=4)} |"
        )
        keys = ("training_loop_s", "provisioned_s", "with_judging_s")
        if all(c.get(k) is not None for k in keys):
            sums = totals.setdefault(r["arm"], [0.0, 0.0, 0.0])
            for i, k in enumerate(keys):
                sums[i] += c[k]
    arms = list(totals)
    if len(arms) > 1:
        base = totals[arms[0]]
        for arm in arms[1:]:
            ratios = ", ".join(
                f"{name} {totals[arm][i] / base[i]:.3g}" if base[i] else f"{name} –"
                for i, name in enumerate(("loop", "provisioned", "with judging"))
            )
            lines += ["", f"Summed over seeds, {arm}/{arms[0]}: {ratios}."]
    return lines


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
    ]
    start = outcome.get("warm_start")
    if start and start["rates"]:
        low, high = min(start["rates"]), max(start["rates"])
        span = f"{low:.3f}" if low == high else f"{low:.3f} to {high:.3f}"
        lines += [
            (
                f"**Uninformative: the warm start already meets the target.** Its held-out "
                f"success is {span} against the bar of {start['threshold']}: time to target "
                "measures no learning here (the speed endpoint, where registered, still holds)."
            )
            if start["uninformative"]
            else f"**Warm start.** Held-out success {span}, below the bar of "
            f"{start['threshold']}: reaching the target takes learning.",
            "",
        ]
    if outcome.get("confirmation_null"):
        lines += [
            f"**Confirmation.** Each accepted crossing is evaluated again on fresh episodes, "
            f"exact binomial test of {outcome['confirmation_null']}. A crossing that is not "
            "confirmed is never reached: censored at the budget everywhere below.",
            "",
        ]
    if outcome.get("stop_at_target"):
        lines += [
            "**Stopping.** Registered: each run stops once its fate is decided (its first "
            "accepted crossing judged by the confirmation, or its budget spent); its checkpoints "
            "were evaluated while its clock stood still. Time after the decision was not spent, "
            "and each curve ends at its run's stop (the table's last column says why it stopped).",
            "",
        ]
    lines += ["## Primary endpoint (pre-registered)", ""]
    lines += [_primary_line(p) for p in outcome.get("primary", [])] or ["- one arm: –"]
    timed = (outcome.get("speed") or {}).get("controls") or []
    if timed:
        missed = [c for c in timed if c["verdict"] != "as expected"]
        lines.append(
            "- Controls timed in the same blocks, judged by this endpoint: "
            + (
                "all as expected (" + ", ".join(c["runs_as"] for c in timed) + ")."
                if not missed
                else "**"
                + "; ".join(f"{c['runs_as']} {c['verdict']}" for c in missed)
                + "**: the blocks' speed verdict is not backed by its controls."
            )
        )
    lines.append("")
    if outcome.get("speed"):
        lines += speed.lines(outcome["speed"])
    lines += [
        "## Did the arms see the same training data? (exact divergence)",
        "",
    ]
    recorded = outcome.get("machine_kinds") or []
    kinds = [k for k in recorded if k]
    if kinds:
        said = (
            f"Every run trained on one machine kind: {kinds[0]}"
            if len(kinds) == 1
            else f"The runs trained on {len(kinds)} machine kinds: {'; '.join(kinds)}"
        )
        if None in recorded:
            said += " (some runs recorded none)"
        lines += [f"{said}. Bits repeat, where at all, within one kind only.", ""]
    lines += [_divergence_line(check) for check in outcome["divergence"]] or ["- one arm: –"]
    lines.append("")
    if outcome.get("replay"):
        lines += trace_replay.lines(outcome["replay"])
    if outcome["equivalence"] is not None:
        lines += ["## Learning curves: equivalent within the margin?", ""]
        lines += [_equivalence_line(check) for check in outcome["equivalence"]]
        lines.append("")
    lines += ["## Historical comparison: the old coincidence check (not a verdict)", ""]
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
        pair = f"{check['candidate']} vs {check['baseline']}"
        if not _replicated(outcome, check):
            lines.append(f"- {pair}: {NO_REPLICATION}.")
            continue
        lines.append(f"- {pair}: {verdict} ({check['historical']}).{detail}")
    if not outcome["coincidence"]:
        lines.append("- one arm: –")
    lines += ["", *_clock_lines(outcome["runs"])]
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
            if r.get("unconfirmed_crossing"):
                u = r["unconfirmed_crossing"]
                outcome_text += f" (crossed at {u['checkpoint']}: {u['reason']})"
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
    lines += ["", *_secondary_lines(outcome.get("secondary", []))]
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
    lines += _consistency_lines(outcome["runs"])
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
    parser.add_argument(
        "--timing",
        type=Path,
        help="the timing blocks' executions (trainer/timing.py), where target.yaml registers them",
    )
    args = parser.parse_args(argv)
    for files in args.runs:
        if len(files) < 3:
            parser.error(f"--run {' '.join(files)}: give pins.json, checkpoints.jsonl, run.json")
    return args


BY_NAME = ("steps.jsonl", "trajectories.jsonl", "confirm.json", "replay.json")
HONEST_EVALUATIONS = "eval-honest"  # the folder of an evaluation corruption's honest evaluations


def load_run(files: list[str]) -> RunRecords:
    """One --run group: three files in order, then steps.jsonl, trajectories.jsonl,
    confirm.json and replay.json known by their names (each optional), and the evaluations
    (eval-honest/ ones apart: an evaluation corruption's honest evaluations)."""
    pins, checkpoints, run, *rest = files
    named = {Path(f).name: f for f in rest if Path(f).name in BY_NAME}
    honest = [f for f in rest if Path(f).parent.name == HONEST_EVALUATIONS]
    evaluations = [f for f in rest if Path(f).name not in BY_NAME and f not in honest]
    return RunRecords.load(
        pins,
        checkpoints,
        run,
        evaluations,
        named.get("steps.jsonl"),
        named.get("trajectories.jsonl"),
        named.get("confirm.json"),
        honest,
        named.get("replay.json"),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        prereg, receipts = preregistration.frozen_inputs(args)
        runs = [load_run(files) for files in args.runs]
        timing = list(read_jsonl(args.timing)) if args.timing else None
        outcome = compute_outcome(runs, prereg, timing)
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
        + [subject(p, d) for p, d in sorted(outcome["inputs"].items())]
        + ([subject(args.timing)] if args.timing else []),
        predicate={
            "experiment_id": outcome["experiment_id"],
            "divergence": {
                f"{c['candidate']}/seed{s['seed']}": s["verdict"]
                for c in outcome["divergence"]
                for s in c["seeds"]
            },
            # the pre-registered primary endpoint, and the curve verdict of the equivalence test
            # (the old coincidence check is a historical comparison and stays out)
            "primary": {
                f"{p['candidate']}/{p['baseline']}": p["verdict"] for p in outcome["primary"]
            },
            # each A/B run's cross-arm trace replay (analysis/trace_replay.py), where registered
            **(
                {"replay": trace_replay.predicate(outcome["replay"])}
                if outcome.get("replay")
                else {}
            ),
            # the timed controls' verdicts by the primary endpoint (analysis/speed.py)
            "timed_controls": {
                c["runs_as"]: c["verdict"] for c in (outcome.get("speed") or {}).get("controls", [])
            },
            "curves": {
                f"{c['candidate']}/{c['baseline']}": c["curves"].get("claim")
                or c["curves"]["verdict"]
                for c in outcome["equivalence"] or []
            },
            "reached": {f"{r['arm']}/seed{r['seed']}": r["reached"] for r in outcome["runs"]},
        },
        depends_on=receipts.paths,
    )
    print(args.outcome_md.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
