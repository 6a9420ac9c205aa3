"""A model folder's manifest: the sha256 of every file, and the check that a folder is exactly the
files it was pinned to. Light on purpose (no torch): a job refuses a wrong folder before it loads
anything.

Manifest rule: every regular file under the model folder counts, except two top-level pieces of
bookkeeping: the `.cache/` folder that `snapshot_download(local_dir=...)` keeps (download
metadata) and the `.snakemake_timestamp` file Snakemake adds to a directory() output. Nothing
else is ignored.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from envab.errors import Refusal
from envab.hashing import file_manifest

# Bookkeeping that tools drop into a model folder, never model content, and the only paths left out
# of a manifest: snapshot_download's `.cache/` inside local_dir, and the `.snakemake_timestamp`
# Snakemake writes into every directory() output after the job (so after the receipt) is done.
HUB_BOOKKEEPING = ".cache"
SNAKEMAKE_TIMESTAMP = ".snakemake_timestamp"


class ModelPinError(Refusal):
    """A model source, folder or manifest that cannot be used; the message is one line."""


def model_manifest(model_dir: str | Path) -> dict[str, str]:
    """Relative path -> sha256 of every model file (see the module docstring for the one rule)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelPinError(f"model folder {model_dir} does not exist")
    manifest = file_manifest(model_dir)
    return {
        p: h
        for p, h in manifest.items()
        if p.split("/", 1)[0] != HUB_BOOKKEEPING and p != SNAKEMAKE_TIMESTAMP
    }


def manifest_problems(actual: dict[str, str], expected: dict[str, str]) -> dict[str, list[str]]:
    """Paths that differ, grouped as mismatched / missing / extra (empty lists when equal)."""
    return {
        "mismatched": sorted(
            p for p in expected.keys() & actual.keys() if expected[p] != actual[p]
        ),
        "missing": sorted(expected.keys() - actual.keys()),
        "extra": sorted(actual.keys() - expected.keys()),
    }


def check_manifest(model_dir: str | Path, expected: dict[str, str]) -> dict[str, str]:
    """Refuse a model folder whose files are not exactly the expected ones; return the manifest."""
    if not expected:
        raise ModelPinError(
            "model manifest is empty; paste the output of "
            "`python -m envab.trainer.model manifest DIR` (or `pin`) into the config"
        )
    actual = model_manifest(model_dir)
    problems = manifest_problems(actual, expected)
    if any(problems.values()):
        named = "; ".join(
            f"{kind}: {', '.join(paths)}" for kind, paths in problems.items() if paths
        )
        raise ModelPinError(f"model folder {model_dir} does not match its manifest ({named})")
    return actual


def read_manifest_file(path: str | Path) -> dict[str, str]:
    """A manifest from YAML or JSON: either the bare mapping or `{manifest: mapping}`."""

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ModelPinError(f"manifest {path}: cannot read ({e})") from None
    if isinstance(data, dict) and isinstance(data.get("manifest"), dict):
        data = data["manifest"]
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v)
        for k, v in data.items()
    ):
        raise ModelPinError(f"manifest {path}: expected a mapping of file path -> sha256 hex")
    return data
