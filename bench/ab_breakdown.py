"""The whole A/B, freeze to outcome, and where its time goes, by rule.

    python bench/ab_breakdown.py [--run] [--directory DIR] [--experiment ID] [--out FILE.json]

With --run: the main job, `snakemake --cores all`, in DIR (default: the checkout, i.e. the
embedded default), timed as a whole. Then, from Snakemake's benchmark files of the experiment
(`benchmarks/<experiment>/`, one per job, written by each rule's `benchmark:` directive), a table
by rule: jobs, wall-clock seconds (summed over the rule's jobs), share of all jobs' time, CPU
seconds, and the largest peak memory of one job (proportional set size summed over the job's
processes, so that pages its sandboxes or VMs share count once). Every job that runs a model
takes the whole machine, so those run one after another; the small jobs (freezing, tables) may
run side by side. With --run the A/B's wall-clock is printed beside the jobs' sum: the difference
is Snakemake's own work (planning, the checkpoint's re-evaluation of the DAG) less that
overlap. A job that Snakemake did not run (its outputs were up to date) keeps the benchmark file
of the run that made them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent


def run_ab(directory: Path) -> float:
    """The whole A/B, as the README's first command runs it; its seconds."""
    # A workflow copy has its Snakefile; a config folder such as .test/ runs the checkout's.
    here = directory if (directory / "Snakefile").is_file() else REPO
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--directory", str(directory.resolve())]
        + ["--cores", "all"],
        cwd=here,
    )
    if result.returncode != 0:
        raise SystemExit(f"snakemake --cores all failed in {directory}")
    return time.monotonic() - started


def jobs(benchmarks: Path) -> pd.DataFrame:
    """One row per job: its rule (the benchmark file's folder, or its name for a rule with no
    wildcards) and Snakemake's measures."""
    rows = []
    for path in sorted(benchmarks.rglob("*.tsv")):
        relative = path.relative_to(benchmarks)
        rule = relative.parts[0] if len(relative.parts) > 1 else path.stem
        measured = pd.read_csv(path, sep="\t", na_values=["NA", "-"])
        for _, row in measured.iterrows():  # one row per repeat; the rules repeat once
            rows.append(
                {
                    "rule": rule,
                    "job": str(relative.with_suffix("")),
                    "s": float(row["s"]),
                    "cpu_s": float(row.get("cpu_time", float("nan"))),
                    "peak_pss_mib": float(row.get("max_pss", float("nan"))),
                }
            )
    if not rows:
        raise SystemExit(f"no benchmark files under {benchmarks}: run the workflow first")
    return pd.DataFrame(rows)


def by_rule(table: pd.DataFrame) -> pd.DataFrame:
    grouped = table.groupby("rule").agg(
        jobs=("job", "count"),
        s=("s", "sum"),
        cpu_s=("cpu_s", "sum"),
        peak_pss_mib=("peak_pss_mib", "max"),
    )
    grouped["share"] = grouped["s"] / grouped["s"].sum()
    return grouped.sort_values("s", ascending=False)


def experiment_of(directory: Path, given: str | None) -> str:
    if given:
        return given
    found = sorted(p.name for p in (directory / "benchmarks").glob("*") if p.is_dir())
    if len(found) != 1:
        raise SystemExit(f"name the experiment with --experiment (benchmarks hold {found})")
    return found[0]


def markdown(rules: pd.DataFrame, total_s: float | None) -> str:
    lines = [
        "| rule | jobs | wall-clock s | share of the jobs | CPU s | peak PSS MiB (largest job) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for rule, r in rules.iterrows():
        lines.append(
            f"| {rule} | {int(r.jobs)} | {r.s:.1f} | {r.share:.1%} | {r.cpu_s:.1f} | "
            f"{r.peak_pss_mib:.0f} |"
        )
    jobs_s = rules["s"].sum()
    lines.append(f"| **all jobs** | {rules['jobs'].sum()} | **{jobs_s:.1f}** | 100 % | "
                 f"{rules['cpu_s'].sum():.1f} | |")  # fmt: skip
    if total_s is not None:
        lines.append(
            f"\nThe whole A/B: {total_s:.1f} s ({total_s / 60:.1f} min) against the jobs' sum "
            f"{jobs_s:.1f} s: the difference ({total_s - jobs_s:+.1f} s) is Snakemake's own "
            "time less the overlap of the small jobs that run side by side."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--directory", type=Path, default=REPO)
    p.add_argument("--run", action="store_true", help="run the A/B first")
    p.add_argument("--experiment", help="the experiment id (default: the only one benchmarked)")
    p.add_argument("--out", type=Path, help="also write the figures as JSON")
    args = p.parse_args(argv)
    total_s = run_ab(args.directory) if args.run else None
    experiment = experiment_of(args.directory, args.experiment)
    table = jobs(args.directory / "benchmarks" / experiment)
    rules = by_rule(table)
    print(f"experiment {experiment}, {len(table)} jobs\n")
    print(markdown(rules, total_s))
    if args.out:
        figures = {
            "experiment": experiment,
            "total_s": total_s,
            "rules": rules.reset_index().to_dict(orient="records"),
            "jobs": table.to_dict(orient="records"),
        }
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
