"""Where one experiment's files go, relative to the workflow's working directory: the one home of
the run layout, read by the rules (rules/common.smk), the receipts, the bundle, verify and the
trainer's stop-at-target judge.

    results/<exp>/                    the results (results/<exp>/selections/<name>/ a selection's)
    results/<exp>/<arm>/seed<k>/      a run's folder: pins.json, run.json, checkpoints/ ...
    results/<exp>/evaluations/        the evaluation store, each evaluation played once
    results/<exp>/judged/<arm>/seed<k>/  the stop-at-target judge's records, beside the store
    receipts/<exp>/                   the receipts
    logs/<exp>/, benchmarks/<exp>/    Snakemake's logs and each job's benchmark

An arm or seed given as a Snakemake wildcard ("{arm}", "{seed}") gives the rules' pattern.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

JUDGED = "judged"  # beside the evaluation store (its parent's), never inside a run's folder


def run_part(arm: str, seed: int | str) -> str:
    """A run's part of every per-run path: `<arm>/seed<k>`."""
    return f"{arm}/seed{seed}"


@dataclass(frozen=True)
class Layout:
    """The folders of experiment `experiment_id` under `root` (the workflow's directory)."""

    experiment_id: str
    root: Path = Path(".")

    def _under(self, top: str) -> Path:
        return self.root / top / self.experiment_id

    @property
    def results(self) -> Path:
        return self._under("results")

    @property
    def receipts(self) -> Path:
        return self._under("receipts")

    @property
    def logs(self) -> Path:
        return self._under("logs")

    @property
    def benchmarks(self) -> Path:
        return self._under("benchmarks")

    @property
    def evaluations(self) -> Path:
        return self.results / "evaluations"

    def run(self, arm: str, seed: int | str) -> Path:
        return self.results / run_part(arm, seed)

    def judged(self, arm: str, seed: int | str) -> Path:
        return judged_beside(self.evaluations, arm, seed)

    def run_files(self, name: str) -> list[Path]:
        """Every run folder's file `name` that exists, in path order."""
        return sorted(self.results.glob(f"*/seed*/{name}"))

    def run_of(self, path: str, name: str) -> tuple[str, str] | None:
        """(arm, seed) of the run whose file `name` is `path` (relative to the root, posix, as a
        receipt names it); None for any other path."""
        prefix = (Path("results") / self.experiment_id).as_posix()
        match = re.match(rf"^{re.escape(prefix)}/([^/]+)/seed(\d+)/{re.escape(name)}$", path)
        return (match[1], match[2]) if match else None


def judged_beside(store: str | Path, arm: str, seed: int | str) -> Path:
    """The judge's records of run (arm, seed), beside the evaluation store `store`."""
    return Path(store).parent / JUDGED / run_part(arm, seed)
