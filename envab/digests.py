"""The golden checkpoint digests of a small run, kept as data and compared by a command.

    python -m envab.digests check .test       # after `snakemake --directory .test --cores all`
    python -m envab.digests record .test      # writes this machine kind's entry

A change that must not change behaviour must leave the small run's checkpoints byte for byte as
they were. CPU training here is bit-deterministic only on the same kind of machine with the same
number of threads (torch's sums depend on the instruction set and on how many threads share
them), so the digests are kept per machine kind (`machine_kind`), in `<dir>/digests.yaml`. On a
kind with no entry the check says so and passes nothing: record one, or compare two runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from envab.errors import Refusal, refused
from envab.io import atomic_write_text
from envab.layout import Layout
from envab.machine import describe, machine_kind

DIGESTS = "digests.yaml"
WEIGHTS = "model.safetensors"


def run_digests(records: Path) -> dict[str, str]:
    """Checkpoint name -> its weights' sha256, from a run's checkpoints.jsonl."""
    try:
        lines = records.read_text().splitlines()
    except OSError as e:
        raise Refusal(
            f"{records}: cannot read ({e.strerror}); run the small workflow first"
        ) from None
    found = {}
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            found[record["checkpoint"]] = record["files"][WEIGHTS]
        except (ValueError, KeyError, TypeError):
            raise Refusal(f"{records}:{n}: not a checkpoint record with {WEIGHTS}") from None
    return found


def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    data = yaml.safe_load(path.read_text()) or {}
    return list(data.get("machines") or [])


def compare(expected: dict[str, str], found: dict[str, str]) -> list[str]:
    """One line per checkpoint that differs, is missing or is new; empty when they agree."""
    lines = []
    for name in sorted(set(expected) | set(found)):
        want, got = expected.get(name), found.get(name)
        if want != got:
            lines.append(
                f"{name}: recorded {(want or 'none')[:12]}, this run {(got or 'none')[:12]}"
            )
    return lines


def records_path(root: Path, entry_or_run: dict) -> Path:
    layout = Layout(entry_or_run["experiment"], root)
    return layout.results / entry_or_run["run"] / "checkpoints.jsonl"


def check(root: Path, kind: dict, run: str, experiment: str) -> tuple[int, str]:
    """(exit status, what to print): 0 when this machine kind's digests match, 1 when they
    differ, 0 with a note when no digests were recorded for this kind."""
    found = run_digests(records_path(root, {"experiment": experiment, "run": run}))
    entries = [e for e in load(root / DIGESTS) if e["machine"] == kind and e["run"] == run]
    entries = [e for e in entries if e["experiment"] == experiment]
    if not entries:
        return 0, (
            f"no digests recorded for this machine kind ({describe(kind)}): nothing compared; "
            f"`python -m envab.digests record {root}` records this run's"
        )
    differ = compare(entries[0]["checkpoints"], found)
    if differ:
        return 1, "checkpoint digests MOVED:\n  " + "\n  ".join(differ)
    return 0, f"checkpoint digests unchanged ({len(found)} checkpoints, {experiment}/{run})"


def record(root: Path, kind: dict, run: str, experiment: str) -> str:
    found = run_digests(records_path(root, {"experiment": experiment, "run": run}))
    entries = [
        e
        for e in load(root / DIGESTS)
        if not (e["machine"] == kind and e["run"] == run and e["experiment"] == experiment)
    ]
    entries.append({"machine": kind, "experiment": experiment, "run": run, "checkpoints": found})
    header = (
        "# The small run's checkpoint digests (model.safetensors sha256) per machine kind:\n"
        "# `python -m envab.digests check .test` compares a run with them (envab/digests.py).\n"
    )
    text = header + yaml.safe_dump({"machines": entries}, sort_keys=False, width=100)
    atomic_write_text(root / DIGESTS, text)
    return f"recorded {len(found)} checkpoint digests for this machine kind in {root / DIGESTS}"


def experiment_of(root: Path) -> str:
    config = yaml.safe_load((root / "config.yaml").read_text())
    target = yaml.safe_load((root / config["preregistration"]).read_text())
    return target["experiment_id"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.digests", description=__doc__.split("\n")[0]
    )
    parser.add_argument("action", choices=["check", "record"])
    parser.add_argument("root", type=Path, help="the workflow folder of the run (e.g. .test)")
    parser.add_argument("--run", default="drums/seed1", help="the run: <arm>/seed<k>")
    parser.add_argument("--threads", type=int, help="the threads the run's jobs had")
    args = parser.parse_args(argv)
    try:
        experiment = experiment_of(args.root)
        kind = machine_kind(threads=args.threads)
        if args.action == "record":
            print(record(args.root, kind, args.run, experiment))
            return 0
        status, message = check(args.root, kind, args.run, experiment)
    except Refusal as e:
        return refused(e)
    print(message)
    return status


if __name__ == "__main__":
    sys.exit(main())
