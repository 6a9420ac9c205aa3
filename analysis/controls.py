"""The built-in controls' verdicts: does the analysis find what was put into a run, and only that?

    python -m envab.analysis.controls --target T --receipts R... --run <files of one run> ... \
        --json controls.json --md controls.md --receipt receipts/<exp>/controls.json

Each control (the pre-registration's `controls`; envs/controls.py) is its base arm run again as
`<arm>-<name>` with one known change. For every seed both ran, the control's run is compared with
the base arm's by the A/B's own checks (exact divergence, the curve-equivalence test, wall-clock at
the shared checkpoints), and the control passes when what comes out is what was registered:

- same (A/A): no divergence on any seed and the curves equivalent. The wall-clock ratio at the
  base run's target checkpoint is this machine's timing noise floor (shown, not judged: a single
  draw per seed).
- slower (throughput handicap): no divergence, and at the base run's accepted crossing (its last
  checkpoint if it never crossed) the added wall-clock is the predicted one within `tolerance`:
  reset_delay_s x the environment set-ups the control made before that checkpoint, counted from its
  trajectories (one per fork group; one per attempt on an arm that does not fork).
- differ (silent corruption): every seed diverges. The curve test is shown beside it but not
  required: a few flipped rewards may well leave the curves within the margin, and only the exact
  divergence check is bound to see a corruption that passes every gate.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envab import preregistration
from envab.analysis.divergence import first_divergence
from envab.analysis.equivalence import curve_equivalence
from envab.analysis.outcome import load_run, seed_curves
from envab.analysis.runs import RunRecords
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
    """Wall-clock of the control's run against the base run's at the base's judged checkpoint."""
    name, reached = _judged_checkpoint(base, prereg)
    at_base = {c["checkpoint"]: c for c in base.checkpoints}.get(name)
    at_control = {c["checkpoint"]: c for c in run.checkpoints}.get(name)
    if at_base is None or at_control is None or not at_base["wall_clock_s"]:
        return {"checkpoint": name, "verdict": "not compared", "reason": "no shared checkpoint"}
    timing = {
        "checkpoint": name,
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


def judge(control: Control, base_runs: list[RunRecords], runs: list[RunRecords], prereg) -> dict:
    """One control's checks on every seed both arms ran, and whether they came out as
    registered."""
    base = {r.seed: r for r in base_runs}
    mine = {r.seed: r for r in runs}
    seeds = sorted(set(base) & set(mine))
    if not seeds:
        return {**_header(control), "verdict": "not run", "reason": "no seed ran on both arms"}
    per_seed = []
    for seed in seeds:
        a, b = base[seed], mine[seed]
        divergence = (
            first_divergence(a.steps, b.steps)
            if a.steps is not None and b.steps is not None
            else {"verdict": "not compared", "reason": "no step digests"}
        )
        per_seed.append(
            {"seed": seed, "divergence": divergence, "timing": _timing(control, a, b, prereg)}
        )
    settings = prereg.equivalence
    try:
        curves = curve_equivalence(
            seed_curves([mine[s] for s in seeds]),
            seed_curves([base[s] for s in seeds]),
            margin=settings.margin(prereg.threshold),
            samples=settings.bootstrap_samples,
            confidence=settings.confidence,
        ).to_dict()
    except ValueError as e:
        curves = {"verdict": "not computed", "reason": str(e)}
    diverged = [s["divergence"]["verdict"] == "diverged" for s in per_seed]
    never = [s["divergence"]["verdict"] == "never" for s in per_seed]
    if control.expect == "same":
        ok = all(never) and curves["verdict"] == "equivalent"
    elif control.expect == "slower":
        recovered = [s["timing"].get("verdict") == "recovered" for s in per_seed]
        ok = all(never) and all(recovered)
    else:
        ok = all(diverged)
    return {
        **_header(control),
        "seeds": per_seed,
        "curves": curves,
        "verdict": "as expected" if ok else "NOT as expected",
    }


def _header(control: Control) -> dict:
    return {
        "name": control.name,
        "arm": control.arm,
        "runs_as": control.run_arm,
        "expect": control.expect,
        "change": control.arm_config({}).get("control", {}),
    }


def judge_all(runs: list[RunRecords], prereg: Preregistration) -> list[dict]:
    return [
        judge(
            control,
            [r for r in runs if r.arm == control.arm],
            [r for r in runs if r.arm == control.run_arm],
            prereg,
        )
        for control in prereg.controls
    ]


EXPECTED = {
    "same": "no divergence; curves equivalent",
    "slower": "no divergence; added time = predicted",
    "differ": "divergence on every seed",
}


def _observed(seed: dict) -> str:
    d, t = seed["divergence"], seed["timing"]
    div = f"diverged at step {d['step']}" if d["verdict"] == "diverged" else d["verdict"]
    if d["verdict"] == "never":
        n = d["steps_compared"]
        div = f"never ({n} step{'' if n == 1 else 's'})"
    parts = [f"seed {seed['seed']}: {div}"]
    if "ratio" in t:
        parts.append(f"time x{t['ratio']:.2f} at {t['checkpoint']}")
    if "predicted_added_s" in t:
        parts.append(
            f"added {t['added_s']:.1f} s against {t['predicted_added_s']:.1f} s predicted "
            f"({t['setups']} set-ups, {t['verdict']})"
        )
    return "; ".join(parts)


def render_markdown(judgements: list[dict]) -> str:
    lines = [
        "# Controls",
        "",
        "Each control runs a base arm again with one known change; the A/B's checks must find that "
        "change and nothing else (analysis/controls.py).",
        "",
        "| control | runs as | change | expected | observed | curves | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for j in judgements:
        change = ", ".join(f"{k} {v}" for k, v in j["change"].items() if k != "seed") or "none"
        observed = "<br>".join(_observed(s) for s in j.get("seeds", [])) or j.get("reason", "")
        curves = j.get("curves", {}).get("verdict", "")
        lines.append(
            f"| {j['name']} | {j['runs_as']} | {change} | {EXPECTED[j['expect']]} | {observed} "
            f"| {curves} | **{j['verdict']}** |"
        )
    if not judgements:
        lines.append("| (none registered) | | | | | | |")
    return "\n".join(lines) + "\n"


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
        judgements = judge_all(runs, prereg)
    except (Refusal, FileNotFoundError, ValueError) as e:
        return refused(e)
    atomic_write_json(args.json, {"experiment_id": prereg.experiment_id, "controls": judgements})
    atomic_write_text(args.md, render_markdown(judgements))
    inputs = {p: d for run in runs for p, d in run.inputs.items()}
    write_receipt(
        args.receipt,
        "controls",
        subjects=[subject(args.json), subject(args.md)]
        + [subject(p, d) for p, d in sorted(inputs.items())],
        predicate={
            "experiment_id": prereg.experiment_id,
            "verdicts": {j["name"]: j["verdict"] for j in judgements},
        },
        depends_on=receipts.paths,
    )
    print(args.md.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
