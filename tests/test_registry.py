"""The registry of experiments: every shipped target is listed, ids are unique, and no entry
lacks an outcome (an abandoned experiment says what became of it)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def registry() -> list[dict]:
    return yaml.safe_load((REPO / "preregistration" / "registry.yaml").read_text())["experiments"]


def test_every_shipped_target_is_registered():
    ids = {entry["id"] for entry in registry()}
    for target in [*(REPO / "preregistration").glob("*.yaml"), REPO / ".test" / "target.yaml"]:
        if target.name == "registry.yaml":
            continue
        assert yaml.safe_load(target.read_text())["experiment_id"] in ids, target


def test_entries_are_unique_and_say_what_became_of_them():
    entries = registry()
    assert len({e["id"] for e in entries}) == len(entries)
    for entry in entries:
        assert entry["status"] and entry["outcome"], entry["id"]
        if entry["status"] == "superseded":
            assert entry["why_superseded"], entry["id"]
    assert sum(e["status"] == "current" for e in entries) == 1
