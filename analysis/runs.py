"""One training run's records as the analysis reads them: what the run is pinned to
(pins.json), its checkpoint records (checkpoints.jsonl), its final counters and stop reason
(run.json) and the held-out evaluation of each checkpoint (eval/<checkpoint>.json).

The caller names every file; nothing is found by globbing a directory, so each file a job reads is
one its Snakemake rule declares.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from envab.hashing import sha256_file
from envab.io import read_jsonl
from envab.run_pins import RunPins


@dataclass
class RunRecords:
    arm: str
    seed: int
    pins: RunPins
    checkpoints: list[dict]
    evaluations: dict[str, dict]  # checkpoint name -> held-out result
    final: dict  # run.json
    inputs: dict[str, str]  # path -> sha256 of every file read
    steps: list[dict] | None = None  # steps.jsonl: a digest per training step, when given
    trajectories: list[dict] | None = None  # trajectories.jsonl: one line per attempt, when given
    confirmation: dict | None = None  # confirm.json: the accepted crossing evaluated afresh
    # eval-honest/<checkpoint>.json: an evaluation corruption's checkpoints evaluated honestly
    honest_evaluations: dict[str, dict] | None = None
    replay: dict | None = None  # replay.json: its attempts replayed on every arm (eval/replay.py)

    @classmethod
    def load(
        cls,
        pins: str | Path,
        checkpoints: str | Path,
        run: str | Path,
        evaluations: Iterable[str | Path],
        steps: str | Path | None = None,
        trajectories: str | Path | None = None,
        confirmation: str | Path | None = None,
        honest_evaluations: Iterable[str | Path] = (),
        replay: str | Path | None = None,
    ) -> RunRecords:
        """`evaluations` are eval/<checkpoint>.json files; a file's stem names its checkpoint.
        `steps`: the run's steps.jsonl (trainer/step_digests.py), for the divergence check;
        `trajectories`: its trajectories.jsonl (the controls count environment set-ups in it);
        `confirmation`: its confirm.json (analysis/confirm.py); `honest_evaluations`:
        eval-honest/<checkpoint>.json files (an evaluation corruption's); `replay`: its
        replay.json (eval/replay.py)."""
        # Sorted so the per-run sums over evaluations add up in the same order however the
        # files are given.
        evaluation_files = sorted(Path(e) for e in evaluations)
        names = [e.stem for e in evaluation_files]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"more than one evaluation file for checkpoint(s) {repeated}")
        files = [Path(pins), Path(checkpoints), Path(run), *evaluation_files]
        files += [Path(steps)] if steps else []
        files += [Path(trajectories)] if trajectories else []
        files += [Path(confirmation)] if confirmation else []
        files += [Path(replay)] if replay else []
        honest_files = sorted(Path(e) for e in honest_evaluations)
        files += honest_files
        pinned = RunPins.load(files[0])
        return cls(
            arm=pinned.arm,
            seed=pinned.seed,
            pins=pinned,
            checkpoints=list(read_jsonl(files[1])),
            evaluations={e.stem: json.loads(e.read_text()) for e in evaluation_files},
            final=json.loads(files[2].read_text()),
            inputs={f.as_posix(): sha256_file(f) for f in files},
            steps=list(read_jsonl(steps)) if steps else None,
            trajectories=list(read_jsonl(trajectories)) if trajectories else None,
            confirmation=json.loads(Path(confirmation).read_text()) if confirmation else None,
            honest_evaluations={e.stem: json.loads(e.read_text()) for e in honest_files}
            if honest_files
            else None,
            replay=json.loads(Path(replay).read_text()) if replay else None,
        )
