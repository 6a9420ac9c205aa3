"""Receipts: what a run writes for reviewers, one JSON file per frozen item.

Layout follows the in-toto Statement: ``subject[]`` lists the files the receipt vouches for, each
with ``digest.sha256``; ``predicate`` holds what was recorded, including ``depends_on``: the
receipts this one builds on, named by path and digest, so tampering with any one shows in
``verify`` on every receipt that depends on it. ``predicate.statement_sha256`` is the digest of the
receipt itself with that field left out, so an edited receipt that nothing depends on shows too.
That digest catches edits, not forgery: whoever can rewrite a receipt can recompute it. With a
signing key (`ENVAB_SIGNING_KEY`, envab/signing.py) each receipt also gets a DSSE envelope that
`verify --public-key` checks. Paths are relative to the workflow's working directory.
"""

from __future__ import annotations

import datetime as _dt
import json
import subprocess
from pathlib import Path

from envab.hashing import sha256_file, sha256_json
from envab.io import atomic_write_json
from envab.layout import Layout

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_PREFIX = "https://env-ab.dev/receipt/"


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def git(*args: str, root: str | Path = ".", timeout: float = 60) -> str | None:
    """What `git <args>` prints in `root` (stripped), or None outside a checkout or on failure."""
    try:
        out = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=timeout, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def repo_commit(root: str | Path = ".") -> dict:
    """The git commit the code came from, and whether the work tree had changes; nulls if none."""
    commit = git("rev-parse", "HEAD", root=root, timeout=10)
    if not commit:
        return {"commit": None, "dirty": None}
    changes = git("status", "--porcelain", "--untracked-files=no", root=root, timeout=10)
    return {"commit": commit, "dirty": bool(changes)}


def subject(path: str | Path, digest: str | None = None) -> dict:
    path = Path(path)
    return {"name": path.as_posix(), "digest": {"sha256": digest or sha256_file(path)}}


def write_receipt(
    path: str | Path,
    kind: str,
    subjects: list[dict],
    predicate: dict,
    depends_on: list[str | Path] = (),
) -> dict:
    """Write a receipt atomically and return it. `kind` names the predicate type."""
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_PREFIX + kind + "/v1",
        "predicate": {
            **predicate,
            "depends_on": [subject(p) for p in depends_on],
            "written_utc": utc_now(),
        },
    }
    statement["predicate"]["statement_sha256"] = statement_digest(statement)
    atomic_write_json(path, statement)
    from envab.signing import sign_if_configured  # cryptography only where receipts are written

    sign_if_configured(path, statement)
    return statement


def statement_digest(statement: dict) -> str:
    """Digest of a receipt with its own `statement_sha256` left out."""
    predicate = {k: v for k, v in statement["predicate"].items() if k != "statement_sha256"}
    return sha256_json({**statement, "predicate": predicate})


def read_receipt(path: str | Path) -> dict:
    with open(path) as f:
        statement = json.load(f)
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise ValueError(f"{path}: not an env-ab receipt (no in-toto Statement _type)")
    return statement


def receipt_dir(experiment_id: str, root: str | Path = ".") -> Path:
    return Layout(experiment_id, Path(root)).receipts


# What is frozen before the first training step; every later job reads these.
FREEZE_RECEIPTS = ("preregistration.json", "split.json", "code.json", "model.json")


class Receipts:
    """The receipt files a job was given (its declared inputs), found by file name."""

    def __init__(self, paths: list[str | Path]):
        self.paths = [Path(p) for p in paths]
        self._by_name = {p.name: p for p in self.paths}

    def __getitem__(self, name: str) -> Path:
        if name not in self._by_name:
            raise KeyError(f"receipt {name} was not given (given: {sorted(self._by_name)})")
        return self._by_name[name]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name
