"""The receipts each training run leaves, and which of them a finished run must have.

A run's records (pins.json, trajectories.jsonl, steps.jsonl, checkpoints.jsonl, and through it
every checkpoint file it lists, run.json) used to get no digest until the analysis read them, so
an edit made between the end of training and the analysis went into the outcome as if trained.
The training job now writes a *training-records receipt*, receipts/<exp>/train_<arm>_seed<k>.json,
as its last step: after run.json and before the run's journal is removed, so that a process killed
in between resumes from the journal and writes it at its end (a resumed run always rewrites it).
It is signed like every receipt when ENVAB_SIGNING_KEY is set.

`verify` requires one for every finished run of an experiment whose freeze receipt lists
"training" in `run_receipts` (every experiment frozen since these receipts exist): each run
folder results/<exp>/<arm>/seed<k>/ holding a run.json (the trainer writes it only when the run
ends), and each run.json another receipt names (the outcome's), so that deleting a run's folder
with its receipt still shows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from envab.layout import Layout
from envab.receipts import read_receipt, subject, write_receipt

TRAINING = "training"
#: What a run of an experiment frozen now must leave in receipts/<exp>/ (recorded at freeze).
RUN_RECEIPTS = (TRAINING,)
RUN_RECORD = "run.json"  # the final record: written once, when the run ends


def training_receipt_name(arm: str, seed: int | str) -> str:
    """The file name of a run's training-records receipt, as the train job's log is named."""
    return f"train_{arm}_seed{seed}.json"


def write_training_receipt(
    path: str | Path, records: Iterable[str | Path], depends_on: Iterable[str | Path], run: dict
) -> dict:
    """The training-records receipt of one run: a digest of each record file as training left
    it, with the run's final counters (`run`: its run.json) to read it by."""
    records = [Path(p) for p in records]
    return write_receipt(
        path,
        "training-records",
        subjects=[subject(p) for p in records],
        predicate={
            "experiment_id": run["experiment_id"],
            "arm": run["arm"],
            "seed": run["seed"],
            "stop_reason": run["stop_reason"],
            "valid_trajectories": run["valid_trajectories"],
            "checkpoints": run["checkpoints"],
            "restarts": len(run.get("restarts") or []),
            # lines per record file: how much the digests vouch for, readable without the files
            "lines": {p.name: _lines(p) for p in records if p.suffix == ".jsonl"},
        },
        depends_on=list(depends_on),
    )


def _lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def required_kinds(receipts: Path) -> tuple[str, ...]:
    """The run receipts the experiment's freeze receipt says its runs must leave; none where it
    cannot be read (verify reports that receipt itself) or predates the field."""
    try:
        kinds = read_receipt(receipts / "preregistration.json")["predicate"].get("run_receipts")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ()
    return tuple(kinds) if isinstance(kinds, list) else ()


def finished_runs(receipts: Path, root: Path) -> dict[tuple[str, str], str]:
    """(arm, seed) -> the run.json that says the run finished: each one under
    results/<exp>/, and each one a receipt in the folder names as a subject."""
    layout = Layout(receipts.name, root)
    names = [path.relative_to(root).as_posix() for path in layout.run_files(RUN_RECORD)]
    for file in sorted(receipts.glob("*.json")):
        try:
            subjects = json.loads(file.read_text())["subject"]
            names += [s["name"] for s in subjects if isinstance(s.get("name"), str)]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # verify reports a receipt it cannot read
    runs = {}
    for name in sorted(set(names)):
        if run := layout.run_of(name, RUN_RECORD):
            runs.setdefault(run, name)
    return runs


def missing(receipts: str | Path, root: str | Path = ".") -> list[tuple[str, str]]:
    """(receipt path, what requires it) for every run receipt a finished run must have and does
    not: what `verify` reports MISSING."""
    receipts, root = Path(receipts), Path(root)
    if TRAINING not in required_kinds(receipts):
        return []
    return [
        ((receipts / training_receipt_name(arm, seed)).as_posix(), run)
        for (arm, seed), run in sorted(finished_runs(receipts, root).items())
        if not (receipts / training_receipt_name(arm, seed)).is_file()
    ]
