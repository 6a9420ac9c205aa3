"""sha256 of the code that must not differ between arms, and of the code that decides the answer.

The trainer, the reward and drop-rule code, the environment adapters, the evaluation, and the
analysis that stops a run at its target, judges crossings and confirmations, tests and renders the
verdict (design rule 11): per file and in aggregate. One list for every config (`CODE_PINS`), not
a config key: a config that left a group out would register an experiment whose deciding code is
not frozen.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from envab.hashing import aggregate_digest, sha256_file
from envab.receipts import git

# Patterns relative to the repository (the folder of the Snakefile). `reward` names files that
# `envs` holds too: it is the group the arms' pins compare by name.
CODE_PINS: dict[str, list[str]] = {
    "trainer": ["trainer/**/*.py"],
    "reward": ["envs/tasks/checkers.py", "envs/protocol.py", "envs/xdesktop/evaluate.py"],
    "envs": ["envs/**/*.py"],
    "eval": ["eval/**/*.py"],
    # the stop-at-target judge, the crossing and confirmation rules, the paired test, the outcome
    "analysis": ["analysis/**/*.py"],
    "pipeline": ["envab/**/*.py", "Snakefile", "rules/*.smk", "schemas/*.yaml", "pyproject.toml"],
}


def code_pins(repository: str | Path = ".") -> dict[str, list[str]]:
    """`CODE_PINS` as seen from the working directory, for a workflow whose Snakefile lies in
    `repository` (`..` for `snakemake --directory .test`): the receipt names each file as every
    later job and `verify` open it."""
    prefix = Path(os.path.relpath(repository))
    return {
        group: [(prefix / pattern).as_posix() for pattern in patterns]
        for group, patterns in CODE_PINS.items()
    }


def uncommitted(paths: list[str]) -> list[str] | None:
    """Which of `paths` (relative to the working directory) differ from the repository's last
    commit, by git's own blob digest: edited, or not in the commit at all. A freeze on a dirty
    tree is recorded with them, never hidden. None outside a git checkout."""

    top = git("rev-parse", "--show-toplevel")
    tree = git("ls-tree", "-r", "--full-tree", "HEAD")
    if top is None or tree is None:
        return None
    committed = {}
    for line in tree.splitlines():
        meta, _, name = line.partition("\t")
        committed[name] = meta.split()[-1]
    root = Path(top)
    dirty = []
    for path in paths:
        data = Path(path).read_bytes()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        name = Path(os.path.relpath(Path(path).resolve(), root)).as_posix()
        if committed.get(name) != blob:
            dirty.append(path)
    return sorted(dirty)


def pin_groups(groups: dict[str, list[str]], root: str | Path = ".") -> dict[str, dict]:
    """group -> {"files": {path: sha256}, "sha256": aggregate}.

    A pattern that matches nothing is an error: a renamed file must not drop out of the pins.
    """
    root = Path(root)
    pinned = {}
    for group, patterns in sorted(groups.items()):
        files: dict[str, str] = {}
        for pattern in patterns:
            matches = [
                p for p in root.glob(pattern) if p.is_file() and "__pycache__" not in p.parts
            ]
            if not matches:
                raise FileNotFoundError(f"code_pins.{group}: pattern {pattern!r} matches no file")
            for p in matches:
                files[p.relative_to(root).as_posix()] = sha256_file(p)
        files = dict(sorted(files.items()))
        pinned[group] = {"files": files, "sha256": aggregate_digest(files)}
    return pinned


def changed_since(predicate: dict, root: str | Path = ".") -> list[str]:
    """The pinned files that differ now from a code receipt's predicate: edited, removed, or
    added under a frozen pattern. FileNotFoundError where a frozen pattern matches nothing."""
    now = pin_groups(predicate["patterns"], root)
    frozen = predicate["groups"]
    before = {p: d for g in frozen.values() for p, d in g["files"].items()}
    current = {p: d for group in frozen for p, d in now[group]["files"].items()}
    return sorted(p for p in before.keys() | current.keys() if before.get(p) != current.get(p))
