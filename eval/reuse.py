"""Evaluations keyed by what decides their result, so that each is played once.

A checkpoint identical file for file (its recorded sha256 manifest), played on the same backend
under the same protocol and tools, on the same held-out set, gives the same evaluation: the
starting model of every run, or an A/A control's checkpoint and its base run's. The first job to
evaluate such a checkpoint stores its record under the key; every later job with that key
takes the record, marked `reused` and naming the run it was evaluated for, and plays nothing.
The record keeps the measured wall-clock and cost of the evaluation that was played: they are
what evaluating that checkpoint costs, whichever run's job happened to go first.

The store is one JSON file per key (`results/<exp>/evaluations/<key>.json`), written atomically
after an evaluation finishes. Delete the folder to have every checkpoint played afresh. A job
checks its checkpoint's files against the run's record before it looks in the store, so a
tampered checkpoint is refused, never matched to a clean one's result.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from envab.hashing import sha256_json
from envab.io import atomic_write_json


def evaluation_key(
    files: dict[str, str], protocol: dict, tools: str, backend: dict, heldout_sha256: str
) -> str:
    """sha256 over everything an evaluation's result depends on within one experiment (the target,
    the code and the split are frozen per experiment, and the store is per experiment)."""
    return sha256_json(
        {
            "checkpoint_files": files,
            "protocol": protocol,
            "tools": tools,
            "backend": backend,
            "heldout_sha256": heldout_sha256,
        }
    )


class Store:
    """Finished evaluation records by key, in a folder."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str) -> dict | None:
        path = self.path(key)
        if not path.is_file():
            return None
        record = json.loads(path.read_text())
        if record.get("evaluation_key") != key:  # a file renamed by hand is not this evaluation
            return None
        return record

    def put(self, key: str, record: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path(key), record)


def evaluated_once(
    store: Store | None, key: str, evaluate: Callable[[], dict], evaluated_for: str
) -> dict:
    """The record `evaluate()` gives, or the stored one for `key` when there is one.

    Either way it carries `evaluation_key`, `evaluated_for` (the run and checkpoint it was played
    for) and `reused` (whether this job took it from the store). Without a store every call plays.
    """
    if store is not None and (found := store.get(key)) is not None:
        return {**found, "reused": True}
    record = {**evaluate(), "evaluation_key": key, "evaluated_for": evaluated_for}
    if store is not None:
        store.put(key, record)
    return {**record, "reused": False}
