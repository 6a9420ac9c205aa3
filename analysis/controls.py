"""The built-in controls' verdicts: does the analysis find what was put into a run, and only that?

    python -m envab.analysis.controls --target T --receipts R... --run <files of one run> ... \
        --json controls.json --md controls.md --receipt receipts/<exp>/controls.json

Each control (the pre-registration's `controls`; envs/controls.py) is its base arm run again as
`<arm>-<name>` with one known change. For every seed both ran, the control's run is compared with
the base arm's, and the control passes when what comes out is what was registered.

Exact divergence only means something where training is bit-deterministic, so the rules depend
on whether it is. Registered: the pre-registration's `determinism` (expected | not_expected).
Observed: the A/A control is a replay of its base arm (same seed, same backend), so its exact
divergence is the evidence: "bit-deterministic" when every A/A seed never diverged, "not
bit-deterministic" when one did, "unknown" with no A/A. The observation decides which rules hold
(the registration, where nothing was observed); expected and not observed is a failing row of its
own, and the controls are then judged by the rules that hold, never failed (or passed) by
construction.

Deterministic (exact divergence decides):
- same (A/A): no divergence on any seed and the curves equivalent.
- slower (throughput handicap): no divergence, and the added wall-clock recovered (below).
- differ (silent corruption): every seed diverges.
- eval_differs (evaluation corruption): no divergence (its training is its base arm's, so a
  replay), and its checkpoints' reported evaluations disagree with their honest ones (below).

Not deterministic (curves, times and reward consistency; analysis/curve_difference.py,
analysis/reward_consistency.py). The A/A and handicap each have two checks that can fail them by
chance, and the corruption two that can pass it, so each is run at alpha / 2 (Bonferroni: the
control's false failure, or false pass, rate at most alpha, alpha being the primary endpoint's):
- same: the curve test over seeds x held-out tasks does not say "differ", and the A/A's reward
  disagreement is not higher than its base arm's. With one seed per arm the curve test makes no
  claim: "not powered", not a pass.
- slower: the same two checks, and the added wall-clock over seeds (`added_time_test`: the
  residuals against the prediction t-tested, a slowdown seen at all), each at alpha / 3. A run
  that is not a replay takes its own path, so one seed's added time is not the delay's alone:
  with one seed, "not powered".
- differ: the corrupted arm's reward disagreement (same task, same actions, another reward) is
  higher than its base arm's, or the curve test says "differ" where it has power POWERED at the
  curve gap the registered flip_rewards predicts (`_curve_power`, the arithmetic shown): "as
  expected"; neither, where one of the two had that power: "NOT as expected"; otherwise "not
  powered", never a pass.
- eval_differs: as with determinism but for the divergence, which is shown, not judged.

The evaluation corruption's check is the same with or without bit-determinism: each checkpoint
of the control's runs is evaluated twice, reported (flip_eval of its valid scores flipped by the
evaluation workload) and honestly (eval-honest/), episode by episode (checkpoint, task, episode
seed); a pair that sent the same actions (actions_sha256) must score alike in a deterministic
environment even where the policy's sampling is not bit-deterministic, so comparable pairs that
disagree more often than the honest evaluations disagree among themselves (same task, same
actions, one-sided Fisher at alpha) is the evidence, with its power at flip_eval ("not
powered" below POWERED, never a pass). Where training is bit-deterministic the honest
evaluation is the base run's, reused (eval/reuse.py: the same checkpoint files); where it is not,
it is played.

The added wall-clock (slower): at the base run's accepted crossing (its last checkpoint if it
never crossed; the control's last checkpoint where the control's own trajectory budget,
`max_valid_trajectories`, stopped it before that) the control's wall-clock minus the base's is
reset_delay_s x the environment set-ups the control made before that checkpoint, counted from
its trajectories (one per fork group; one per attempt on an arm that does not fork), within
`tolerance`. Where the registration times the handicap in its blocks and says
`timing.handicap_run_time: shown`, the blocks alone judge its speed (analysis/speed.py) and this
added time is shown, not judged: at the smallest effect of interest one run's added seconds
cannot be told from one run's noise (v14's handicap added 5.1 s to a run whose base took 7 s
longer than the same weights' run an hour before). The A/A's wall-clock ratio there is this
machine's timing noise floor (shown, not judged: one draw per seed). Every run's reward
consistency is shown whatever the rules: a flaky verifier is a finding on its own.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from envab import preregistration
from envab.analysis.curve_difference import cluster_curve_test, detectable_gap, power_at
from envab.analysis.divergence import first_divergence
from envab.analysis.equivalence import curve_equivalence
from envab.analysis.outcome import load_run, seed_curves
from envab.analysis.reward_consistency import (
    POWERED,
    consistency,
    evaluation_lines,
    excess,
    flip_power,
    pair_power,
    paired_episodes,
    pooled,
)
from envab.analysis.runs import RunRecords
from envab.analysis.statistics import t_test_of_zero
from envab.analysis.time_to_target import time_to_target
from envab.errors import Refusal, refused
from envab.io import atomic_write_json, atomic_write_text
from envab.preregistration import Control, Preregistration
from envab.receipts import subject, write_receipt


def setups_before(trajectories: list[dict], attempts: int) -> int:
    """Environment set-ups (backend creates) behind the first `attempts` attempts: one per fork
    group (its children share the parent's id), one per attempt that was not forked."""
    parents, alone = set(), 0
    for line in trajectories[:attempts]:
        if line.get("fork_parent"):
            parents.add(line["fork_parent"])
        else:
            alone += 1
    return len(parents) + alone


def _judged_checkpoint(base: RunRecords, prereg: Preregistration) -> tuple[str | None, bool]:
    """The base run's accepted crossing (confirmed, where a confirmation is registered: an
    unconfirmed crossing is not reached here either), or its last checkpoint when it never
    reached the target."""
    result = time_to_target(
        base.checkpoints,
        base.evaluations,
        prereg.threshold,
        base.final,
        prereg.target.crossing,
        confirmation=base.confirmation,
        confirmation_registered=getattr(prereg, "confirmation", None) is not None,
    )
    if result["reached"]:
        return result["checkpoint"], True
    last = max(base.checkpoints, key=lambda c: c["valid_trajectories"], default=None)
    return (last["checkpoint"] if last else None), False


def _timing(control: Control, base: RunRecords, run: RunRecords, prereg) -> dict:
    """Wall-clock of the control's run against the base run's at the base's judged checkpoint,
    or at the control's last checkpoint where the control's own budget stopped it before."""
    name, reached = _judged_checkpoint(base, prereg)
    base_at = {c["checkpoint"]: c for c in base.checkpoints}
    control_at = {c["checkpoint"]: c for c in run.checkpoints}
    at_base, at_control = base_at.get(name), control_at.get(name)
    judged_at = "base_crossing" if reached else "base_last"
    if at_base is not None and at_control is None:
        shared = [c for c in run.checkpoints if c["checkpoint"] in base_at]
        last = max(shared, key=lambda c: c["valid_trajectories"], default=None)
        if last is not None and last["valid_trajectories"] < at_base["valid_trajectories"]:
            name, judged_at = last["checkpoint"], "control_last"
            at_base, at_control = base_at[name], last
    if at_base is None or at_control is None or not at_base["wall_clock_s"]:
        return {"checkpoint": name, "verdict": "not compared", "reason": "no shared checkpoint"}
    timing = {
        "checkpoint": name,
        "judged_at": judged_at,
        "base_reached_target": reached,
        "base_wall_clock_s": at_base["wall_clock_s"],
        "control_wall_clock_s": at_control["wall_clock_s"],
        "ratio": at_control["wall_clock_s"] / at_base["wall_clock_s"],
        "added_s": at_control["wall_clock_s"] - at_base["wall_clock_s"],
    }
    if control.expect == "slower":
        if run.trajectories is None:
            return {**timing, "verdict": "not compared", "reason": "no trajectories.jsonl"}
        attempts = at_control["valid_trajectories"] + at_control["invalid_discarded"]
        setups = setups_before(run.trajectories, attempts)
        predicted = control.reset_delay_s * setups
        error = (timing["added_s"] - predicted) / predicted if predicted else None
        timing.update(
            setups=setups,
            predicted_added_s=predicted,
            relative_error=error,
            verdict="recovered"
            if error is not None and abs(error) <= control.tolerance
            else "not recovered",
        )
    return timing


DETERMINISTIC, NOT_DETERMINISTIC = "deterministic", "not deterministic"


def _alpha(prereg) -> float:
    """The registered alpha: the primary endpoint's."""
    primary = getattr(prereg, "primary", None)
    return primary.alpha if primary is not None else 0.05


def _curve_inputs(runs: dict, seeds: list) -> dict:
    return seed_curves([runs[s] for s in seeds])


def compare(control: Control, base_runs: list[RunRecords], runs: list[RunRecords], prereg):
    """The evidence on every seed both arms ran (None: none did): per seed, exact divergence,
    wall-clock and each run's reward consistency; the curve tests; the reward consistency pooled
    over seeds, with the corrupted arm's excess over its base and that test's power."""
    base = {r.seed: r for r in base_runs}
    mine = {r.seed: r for r in runs}
    seeds = sorted(set(base) & set(mine))
    if not seeds:
        return None
    alpha = _alpha(prereg)
    per_seed = []
    for seed in seeds:
        a, b = base[seed], mine[seed]
        divergence = (
            first_divergence(a.steps, b.steps)
            if a.steps is not None and b.steps is not None
            else {"verdict": "not compared", "reason": "no step digests"}
        )
        per_seed.append(
            {
                "seed": seed,
                "divergence": divergence,
                "timing": _timing(control, a, b, prereg),
                "reward_consistency": {
                    "base": consistency(a.trajectories),
                    "control": consistency(b.trajectories),
                },
            }
        )
    settings = prereg.equivalence
    try:
        curves = curve_equivalence(
            _curve_inputs(mine, seeds),
            _curve_inputs(base, seeds),
            margin=settings.margin(prereg.threshold),
            samples=settings.bootstrap_samples,
            confidence=settings.confidence,
        ).to_dict()
    except ValueError as e:
        curves = {"verdict": "not computed", "reason": str(e)}
    # Two checks can fail an A/A by chance (three a handicap: its added time too), and two can
    # pass a corruption: each at alpha / 2 (alpha / 3) (module docstring).
    level = {"eval_differs": alpha, "slower": alpha / 3}.get(control.expect, alpha / 2)
    try:
        curve_test = cluster_curve_test(
            _curve_inputs(mine, seeds), _curve_inputs(base, seeds), level
        )
    except ValueError as e:
        curve_test = {"verdict": "not computed", "reason": str(e), "alpha": level}
    if control.expect == "differ":
        curve_test["corruption"] = _curve_power(
            curve_test, _curve_inputs(base, seeds), control.flip_rewards, level
        )
    pooled_base = pooled(s["reward_consistency"]["base"] for s in per_seed)
    pooled_control = pooled(s["reward_consistency"]["control"] for s in per_seed)
    rewards = {
        "base": pooled_base,
        "control": pooled_control,
        "excess_p": excess(pooled_control, pooled_base),
        "alpha": level,
    }
    if control.expect == "differ":
        rewards["power"] = flip_power(pooled_control, pooled_base, control.flip_rewards, level)
        rewards["powered_at"] = POWERED
    evidence = {"seeds": per_seed, "curves": curves, "curve_test": curve_test, "rewards": rewards}
    if control.expect == "slower":
        evidence["time_test"] = added_time_test([s["timing"] for s in per_seed], level)
        timing = getattr(prereg, "timing", None)
        # Registered `timing.handicap_run_time: shown`: the blocks judge this handicap's speed,
        # and one run's added time against one run's is shown beside (module docstring).
        evidence["added_time"] = (
            "judged" if timing is None or timing.judges_run_time(control) else "shown"
        )
    if control.expect == "eval_differs":
        evidence["evaluation"] = _evaluation_check(
            control, [mine[s] for s in seeds], [base[s] for s in seeds], alpha
        )
    return evidence


def added_time_test(timings: list[dict], alpha: float) -> dict:
    """A handicap's added wall-clock without bit-determinism. Its run is not a replay of the
    base's: it takes its own path (other actions, turns, screens), so one seed's added time mixes
    the registered delay with that path's own time, and a per-seed tolerance fails or passes by
    chance. Over seeds the path's part averages out: the residuals (added minus predicted) are
    t-tested against 0 (two-sided: "differs from predicted"), and the added times against 0
    (one-sided: a slowdown must be seen at all, or the test is "not powered"). One seed: no
    replication, "not powered"."""
    rows = [t for t in timings if "predicted_added_s" in t]
    if len(rows) < 2:
        return {
            "verdict": "not powered",
            "seeds": len(rows),
            "alpha": alpha,
            "reason": "one seed: a run that is not a replay adds its own path's time to the delay",
        }
    added = np.array([t["added_s"] for t in rows], dtype=float)
    residual = added - np.array([t["predicted_added_s"] for t in rows], dtype=float)

    def p_of(x: np.ndarray, alternative: str) -> float:
        return t_test_of_zero(x, alternative=alternative)["p_value"]  # no spread: its limit

    p_residual, p_slower = p_of(residual, "two-sided"), p_of(added, "greater")
    out = {
        "seeds": len(rows),
        "alpha": alpha,
        "mean_added_s": float(added.mean()),
        "mean_residual_s": float(residual.mean()),
        "p_residual": p_residual,
        "p_slower": p_slower,
    }
    if p_residual <= alpha:
        return {**out, "verdict": "differs from predicted"}
    if p_slower > alpha:
        return {**out, "verdict": "not powered", "reason": "no slowdown seen over the seeds"}
    return {**out, "verdict": "recovered"}


def _curve_power(curve_test: dict, base_curves: dict, flip: float, alpha: float) -> dict:
    """The curve gap a reward corruption of `flip` is registered to make, and the curve test's
    power to see it at the seeds, tasks and mean squares it had.

    The gap is a model, stated: a flipped reward turns a success's expected reward from q into
    f + (1 - 2f) q, so what training learns from it is scaled by 1 - 2f, and the corrupted curve
    gains (1 - 2f) of the base arm's gain over the warm start: a gap of -2 f x that gain,
    averaged over the trained checkpoints and seeds. Below POWERED power the curve test cannot
    pass the corruption ("not powered"), whatever it says."""
    checkpoints = curve_test.get("checkpoints") or []
    if curve_test.get("p_value") is None or not checkpoints:
        return {"verdict": "not computed", "reason": curve_test.get("reason", "no curve test")}
    if any(0 not in run for run in base_curves.values()):
        return {"verdict": "not computed", "reason": "no warm-start evaluation to measure gain"}

    def rate(cell) -> float:
        outcomes = [o for results in cell.values() for o in results]
        return sum(outcomes) / len(outcomes)

    gains = [rate(run[c]) - rate(run[0]) for run in base_curves.values() for c in checkpoints]
    gain = float(sum(gains) / len(gains))
    gap = -2 * flip * gain
    power = power_at(curve_test, gap, alpha)
    return {
        "flip": flip,
        "base_gain": gain,
        "predicted_gap": gap,
        "se": curve_test["se"],
        "df": curve_test["df"],
        "power": power,
        "detectable_gap": detectable_gap(curve_test, alpha, POWERED),
        "powered_at": POWERED,
        "verdict": "powered" if power is not None and power >= POWERED else "not powered",
    }


def _evaluation_check(
    control: Control, runs: list[RunRecords], base_runs: list[RunRecords], alpha: float
) -> dict:
    """An evaluation corruption's evidence, pooled over seeds: each checkpoint's reported
    evaluation against its honest one, episode by episode (reward_consistency.paired_episodes),
    against the honest evaluations' own disagreement (same task, same actions, another score,
    over every honest evaluation on the evaluation backend: the base runs' and the control's
    honest ones, a record reused for an identical checkpoint counted once), one-sided Fisher at
    alpha, with its power at the registered flip_eval."""
    per_seed, honest_records = [], {}
    for run in [*base_runs, *runs]:
        records = run.evaluations if run in base_runs else (run.honest_evaluations or {})
        for name, record in records.items():
            key = record.get("evaluation_key") or f"{run.arm}/{run.seed}/{name}"
            honest_records[key] = record
    for run in runs:
        if not run.honest_evaluations:
            per_seed.append(
                {"seed": run.seed, "verdict": "not compared", "reason": "no honest evaluation"}
            )
            continue
        per_seed.append(
            {"seed": run.seed, "pairs": paired_episodes(run.evaluations, run.honest_evaluations)}
        )
    compared = [s["pairs"] for s in per_seed if "pairs" in s]
    reported = {
        "pairs": sum(p["pairs"] for p in compared),
        "comparable_groups": sum(p["comparable_groups"] for p in compared),
        "disagreeing_groups": sum(p["disagreeing_groups"] for p in compared),
    }
    honest = consistency(evaluation_lines(honest_records))
    if "comparable_groups" not in honest:  # no honest episode records its actions
        honest = {**honest, "comparable_groups": 0, "disagreeing_groups": 0}
    p = excess(reported, honest)
    return {
        "seeds": per_seed,
        "reported": reported,
        "honest": honest,
        "excess_p": p,
        "alpha": alpha,
        "power": pair_power(reported["comparable_groups"], control.flip_eval, honest, alpha),
        "powered_at": POWERED,
    }


def _evaluation_verdict(evidence: dict) -> tuple[str, list[str]]:
    """An evaluation corruption by its paired evaluations, the same with or without
    bit-determinism: as expected where they disagree beyond the honest evaluations' own rate;
    NOT where they do not and the test had power; otherwise not powered."""
    check = evidence["evaluation"]
    p, power = check["excess_p"], check["power"]
    if p is not None and p <= check["alpha"]:
        return "as expected", []
    r, h = check["reported"], check["honest"]
    why = (
        f"no excess disagreement between the reported and honest evaluations "
        f"({r['disagreeing_groups']}/{r['comparable_groups']} comparable episode pairs disagree, "
        f"honest {h['disagreeing_groups']}/{h['comparable_groups']} comparable groups, "
        f"one-sided Fisher p {_fmt_p(p)}; power {power:.2f} at flip_eval)"
    )
    return ("NOT as expected" if power >= POWERED else "not powered"), [why]


def _deterministic_verdict(control: Control, evidence: dict) -> tuple[str, list[str]]:
    per_seed = evidence["seeds"]
    never = all(s["divergence"]["verdict"] == "never" for s in per_seed)
    if control.expect == "eval_differs":
        # Training is its base arm's: a replay must not diverge; the evaluation must be caught.
        verdict, reasons = _evaluation_verdict(evidence)
        if not never:
            return "NOT as expected", ["training diverged: the corruption reached training"]
        return verdict, reasons
    if control.expect == "same":
        ok = never and evidence["curves"]["verdict"] == "equivalent"
    elif control.expect == "slower":
        recovered = all(s["timing"].get("verdict") == "recovered" for s in per_seed)
        ok = never and (recovered or not _run_time_judged(evidence))
    else:
        ok = all(s["divergence"]["verdict"] == "diverged" for s in per_seed)
    return ("as expected" if ok else "NOT as expected"), []


def _run_time_judged(evidence: dict) -> bool:
    """Whether a handicap's own run's added time is judged (a record from before the rule was
    registered: it was)."""
    return evidence.get("added_time", "judged") == "judged"


def _fmt_p(p: float | None) -> str:
    return "–" if p is None else f"{p:.3g}"


def _nondeterministic_verdict(control: Control, evidence: dict) -> tuple[str, list[str]]:
    """Curves, times and reward consistency (module docstring); the reasons behind a verdict
    that is not "as expected"."""
    if control.expect == "eval_differs":
        return _evaluation_verdict(evidence)
    rewards = evidence["rewards"]
    p = rewards["excess_p"]
    counts = (
        f"{rewards['control']['disagreeing_groups']}/{rewards['control']['comparable_groups']} "
        f"comparable groups disagree, base {rewards['base']['disagreeing_groups']}/"
        f"{rewards['base']['comparable_groups']}, one-sided Fisher p {_fmt_p(p)}"
    )
    curve = evidence["curve_test"]
    if control.expect == "differ":
        return _corruption_verdict(rewards, curve, counts)
    failed, unpowered = [], []
    if curve["verdict"] == "differ":
        failed.append(
            f"curves differ (t over seeds x tasks p {_fmt_p(curve['p_value'])} "
            f"<= {curve['alpha']:g})"
        )
    elif curve["verdict"] != "not shown to differ":
        unpowered.append(f"curves: {curve.get('reason', curve['verdict'])}")
    if p is not None and p <= rewards["alpha"]:
        failed.append(f"excess reward disagreement ({counts} <= {rewards['alpha']:g})")
    if control.expect == "slower" and _run_time_judged(evidence):
        time = evidence["time_test"]
        if time["verdict"] == "differs from predicted":
            failed.append(
                f"added time differs from predicted over {time['seeds']} seeds (mean residual "
                f"{time['mean_residual_s']:+.1f} s, t p {_fmt_p(time['p_residual'])} <= "
                f"{time['alpha']:.3g})"
            )
        elif time["verdict"] == "not powered":
            unpowered.append(f"added time: {time['reason']}")
    if failed:
        return "NOT as expected", failed
    return ("not powered", unpowered) if unpowered else ("as expected", [])


def _corruption_verdict(rewards: dict, curve: dict, counts: str) -> tuple[str, list[str]]:
    """A reward corruption without bit-determinism, by two checks at alpha / 2 each: its reward
    disagreement, and its curves where the curve test is powered for the registered flip (a
    curve test that could not see the corruption never passes it)."""
    p = rewards["excess_p"]
    if p is not None and p <= rewards["alpha"]:
        return "as expected", []
    power = rewards["power"]
    reasons = [f"no excess reward disagreement ({counts}; power {power:.2f})"]
    sized = curve.get("corruption", {})
    curve_powered = sized.get("verdict") == "powered"
    if "power" in sized:
        arithmetic = (
            f"predicted gap -2 x {sized['flip']:g} x base gain {sized['base_gain']:.3f} = "
            f"{sized['predicted_gap']:.3f}; se {sized['se']:.3f} on {sized['df']} df; power "
            f"{sized['power']:.2f} at alpha {curve['alpha']:g}; detectable at "
            f"{sized['powered_at']:g} power: {sized['detectable_gap']:.3f}"
        )
        if curve_powered and curve["verdict"] == "differ":
            return "as expected", []
        seen = "differ" if curve["verdict"] == "differ" else "not shown to differ"
        if curve_powered:
            reasons.append(f"curves {seen} (p {_fmt_p(curve['p_value'])}; {arithmetic})")
        else:
            reasons.append(f"curve test not powered for this corruption ({arithmetic})")
    else:
        reasons.append(f"curve test: {sized.get('reason', curve.get('reason', 'not computed'))}")
    powered = power >= POWERED or curve_powered
    return ("NOT as expected" if powered else "not powered"), reasons


def judge(
    control: Control,
    base_runs: list[RunRecords],
    runs: list[RunRecords],
    prereg,
    rules: str | None = None,
) -> dict:
    """One control's checks on every seed both arms ran, and whether they came out as
    registered, by the `rules` that hold (default: those the registration's determinism
    names; judge_all passes the observed ones)."""
    evidence = compare(control, base_runs, runs, prereg)
    return _judgement(control, evidence, rules or _registered_rules(prereg))


def _judgement(control: Control, evidence: dict | None, rules: str) -> dict:
    if evidence is None:
        return {
            **_header(control),
            "rules": rules,
            "verdict": "not run",
            "reason": "no seed ran on both arms",
        }
    decide = _deterministic_verdict if rules == DETERMINISTIC else _nondeterministic_verdict
    verdict, reasons = decide(control, evidence)
    return {**_header(control), "rules": rules, **evidence, "verdict": verdict, "reasons": reasons}


def _header(control: Control) -> dict:
    return {
        "name": control.name,
        "arm": control.arm,
        "runs_as": control.run_arm,
        "expect": control.expect,
        "change": control.arm_config({}).get("control", {}),
        "max_valid_trajectories": control.max_valid_trajectories,  # None: the A/B's budget
    }


def _registered_rules(prereg) -> str:
    expected = getattr(prereg, "determinism", "expected") == "expected"
    return DETERMINISTIC if expected else NOT_DETERMINISTIC


def observed_determinism(aa_judgements: list[dict]) -> dict:
    """What the A/A controls' exact divergence says about bit-determinism: each is a replay of
    its base arm, so a divergence on any seed means training is not bit-deterministic here."""
    compared = [
        (j["name"], s)
        for j in aa_judgements
        for s in j.get("seeds", [])
        if s["divergence"]["verdict"] in ("never", "diverged")
    ]
    if not compared:
        return {"observed": "unknown", "evidence": "no A/A control compared step digests"}
    diverged = [(name, s) for name, s in compared if s["divergence"]["verdict"] == "diverged"]
    if diverged:
        where = ", ".join(
            f"A/A {name} seed {s['seed']} diverged at step {s['divergence']['step']}"
            for name, s in diverged
        )
        return {"observed": "not bit-deterministic", "evidence": where}
    return {
        "observed": "bit-deterministic",
        "evidence": f"every A/A seed never diverged ({len(compared)} seed(s))",
    }


def determinism(prereg, aa_evidence: list[dict]) -> dict:
    """Registered against observed, and the rules the controls are judged by: the observed
    case where an A/A saw one, the registered one otherwise. `aa_evidence`: each A/A control's
    name and `compare` evidence."""
    registered = getattr(prereg, "determinism", "expected")
    observed = observed_determinism(aa_evidence)
    if observed["observed"] == "unknown":
        rules, verdict = _registered_rules(prereg), "not judged"
        basis = f"registered {registered}; {observed['evidence']}"
    else:
        rules = DETERMINISTIC if observed["observed"] == "bit-deterministic" else NOT_DETERMINISTIC
        broken = registered == "expected" and rules == NOT_DETERMINISTIC
        verdict = "NOT as expected" if broken else "as expected"
        basis = f"training observed {observed['observed']} ({observed['evidence']})"
    return {
        "registered": registered,
        **observed,
        "rules": rules,
        "basis": basis,
        "verdict": verdict,
    }


def _of(runs: list[RunRecords], arm: str) -> list[RunRecords]:
    return [r for r in runs if r.arm == arm]


def judge_all(runs: list[RunRecords], prereg: Preregistration) -> dict:
    """The determinism row and every control's judgement, by the rules that hold."""
    # by the runs' name: two controls may share a name on different arms (an A/A on each)
    evidence = {
        c.run_arm: compare(c, _of(runs, c.arm), _of(runs, c.run_arm), prereg)
        for c in prereg.controls
    }
    aa = [
        {"name": c.run_arm, **evidence[c.run_arm]}
        for c in prereg.controls
        if c.expect == "same" and evidence[c.run_arm] is not None
    ]
    case = determinism(prereg, aa)
    judgements = [_judgement(c, evidence[c.run_arm], case["rules"]) for c in prereg.controls]
    return {"determinism": case, "controls": judgements}


EXPECTED = {
    DETERMINISTIC: {
        "same": "no divergence; curves equivalent",
        "slower": "no divergence; added time = predicted",
        "differ": "divergence on every seed",
        "eval_differs": "no divergence; reported and honest evaluations disagree",
    },
    NOT_DETERMINISTIC: {
        "same": "curves not shown to differ; no excess reward disagreement",
        "slower": "curves not shown to differ; no excess reward disagreement; added time = "
        "predicted",
        "differ": "excess reward disagreement, or curves differ where powered",
        "eval_differs": "reported and honest evaluations disagree",
    },
}


def _expected_text(judgement: dict, rules: str) -> str:
    """What the control must show under `rules`; a handicap whose run time is only shown says
    where its speed is judged instead."""
    text = EXPECTED[rules][judgement["expect"]]
    if judgement["expect"] == "slower" and not _run_time_judged(judgement):
        text = text.replace("added time = predicted", "added time shown (the blocks judge speed)")
    return text


def _rewards_text(c: dict) -> str:
    if "comparable_groups" not in c:
        return c.get("reason", c.get("verdict", ""))
    return f"{c['disagreeing_groups']}/{c['comparable_groups']}"


def _observed(seed: dict, run_time_judged: bool = True) -> str:
    d, t = seed["divergence"], seed["timing"]
    div = f"diverged at step {d['step']}" if d["verdict"] == "diverged" else d["verdict"]
    if d["verdict"] == "never":
        n = d["steps_compared"]
        div = f"never ({n} step{'' if n == 1 else 's'})"
    parts = [f"seed {seed['seed']}: {div}"]
    if "ratio" in t:
        last = " (the control's last)" if t.get("judged_at") == "control_last" else ""
        parts.append(f"time x{t['ratio']:.2f} at {t['checkpoint']}{last}")
    if "predicted_added_s" in t:
        parts.append(
            f"added {t['added_s']:.1f} s against {t['predicted_added_s']:.1f} s predicted "
            f"({t['setups']} set-ups, {t['verdict']}"
            + ("" if run_time_judged else ": shown, not judged")
            + ")"
        )
    rc = seed.get("reward_consistency")
    if rc:
        parts.append(
            f"rewards disagree in {_rewards_text(rc['control'])} comparable groups "
            f"(base {_rewards_text(rc['base'])})"
        )
    return "; ".join(parts)


def _curves_text(j: dict) -> str:
    band = j.get("curves", {}).get("verdict", "")
    curve = j.get("curve_test")
    if not curve:
        return band
    p = curve.get("p_value")
    test = curve["verdict"] + (f" (seeds x tasks p {p:.3g})" if p is not None else "")
    sized = curve.get("corruption", {})
    if sized.get("power") is not None:
        test += f", power {sized['power']:.2f} at the predicted gap {sized['predicted_gap']:.3f}"
    evaluation = j.get("evaluation")
    if evaluation:
        r = evaluation["reported"]
        test += (
            f"; reported vs honest evaluation: {r['disagreeing_groups']}/"
            f"{r['comparable_groups']} comparable episode pairs disagree (Fisher p "
            f"{_fmt_p(evaluation['excess_p'])}, power {evaluation['power']:.2f})"
        )
    return f"{test}; band: {band}"


def render_markdown(judgements: list[dict], determinism: dict | None = None) -> str:
    lines = [
        "# Controls",
        "",
        "Each control runs a base arm again with one known change; the A/B's checks must find that "
        "change and nothing else (analysis/controls.py).",
        "",
    ]
    if determinism:
        rules = (
            "exact divergence decides"
            if determinism["rules"] == DETERMINISTIC
            else "curves, times and reward consistency decide (exact divergence is shown, not "
            "judged)"
        )
        lines += [
            f"**Determinism.** Registered: {determinism['registered']}. Observed: "
            f"{determinism['observed']} ({determinism['evidence']}). The controls are judged as "
            f"{determinism['rules']}: {rules}; {determinism['basis']}.",
            "",
        ]
    lines += [
        "| control | runs as | change | judged as | expected | observed | curves | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    if determinism:
        lines.append(
            f"| determinism | the A/A | none | registered {determinism['registered']} "
            f"| bit-deterministic{' ' if determinism['registered'] == 'expected' else ' or not '}"
            f"| {determinism['observed']}: {determinism['evidence']} | "
            f"| **{determinism['verdict']}** |"
        )
    for j in judgements:
        change = ", ".join(f"{k} {v}" for k, v in j["change"].items() if k != "seed") or "none"
        if j.get("max_valid_trajectories"):
            change += f"; {j['max_valid_trajectories']:,} valid trajectories"
        judged = _run_time_judged(j)
        observed = "<br>".join(_observed(s, judged) for s in j.get("seeds", [])) or j.get(
            "reason", ""
        )
        if j.get("reasons"):
            observed += "<br>" + "; ".join(j["reasons"])
        rules = j.get("rules", DETERMINISTIC)
        lines.append(
            f"| {j['name']} | {j['runs_as']} | {change} | {rules} "
            f"| {_expected_text(j, rules)} | {observed} | {_curves_text(j)} "
            f"| **{j['verdict']}** |"
        )
    if not judgements:
        lines.append("| (none registered) | | | | | | | |")
    lines += _consistency_lines(judgements)
    return "\n".join(lines) + "\n"


def _consistency_lines(judgements: list[dict]) -> list[str]:
    """Every control's reward consistency pooled over seeds, against its base arm's."""
    rows = [j for j in judgements if "rewards" in j]
    if not rows:
        return []
    lines = [
        "",
        "Reward consistency (same task, same actions, same reward; analysis/reward_consistency.py)"
        ", pooled over seeds: disagreeing / comparable groups.",
        "",
        "| control | control's runs | base arm's runs | excess, one-sided Fisher p | power |",
        "|---|---|---|---|---|",
    ]
    for j in rows:
        r = j["rewards"]
        power = f"{r['power']:.2f}" if "power" in r else "–"
        lines.append(
            f"| {j['name']} | {_rewards_text(r['control'])} | {_rewards_text(r['base'])} "
            f"| {_fmt_p(r['excess_p'])} | {power} |"
        )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m envab.analysis.controls", description=__doc__)
    preregistration.add_frozen_arguments(parser)
    parser.add_argument(
        "--run",
        dest="runs",
        action="append",
        nargs="+",
        required=True,
        metavar="FILE",
        help="one run (a base arm's or a control's), as the outcome takes it; a control's run "
        "also names its trajectories.jsonl",
    )
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--md", type=Path, required=True)
    parser.add_argument("--receipt", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        prereg, receipts = preregistration.frozen_inputs(args)
        runs = [load_run(files) for files in args.runs]
        judged = judge_all(runs, prereg)
    except (Refusal, FileNotFoundError, ValueError) as e:
        return refused(e)
    judgements, case = judged["controls"], judged["determinism"]
    atomic_write_json(args.json, {"experiment_id": prereg.experiment_id, **judged})
    atomic_write_text(args.md, render_markdown(judgements, case))
    inputs = {p: d for run in runs for p, d in run.inputs.items()}
    write_receipt(
        args.receipt,
        "controls",
        subjects=[subject(args.json), subject(args.md)]
        + [subject(p, d) for p, d in sorted(inputs.items())],
        predicate={
            "experiment_id": prereg.experiment_id,
            # registered against observed, and the rules every verdict below rests on
            "determinism": {k: case[k] for k in ("registered", "observed", "rules", "verdict")},
            "verdicts": {j["name"]: j["verdict"] for j in judgements},
        },
        depends_on=receipts.paths,
    )
    print(args.md.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
