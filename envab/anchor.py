"""The freeze's anchor: the pre-registration's digest in a file the team commits, outside the
receipts folder, so that deleting the receipts and freezing again with another target is refused.

The receipts live under receipts/<exp>/, next to the results and git-ignored: whoever deletes them
can freeze again, and nothing in the folder would show that the first freeze said otherwise. The
anchor, `anchors/<experiment_id>.json` beside the pre-registration (preregistration/anchors/ for
the shipped targets, .test/anchors/ for the small run), is written by the first freeze of an
experiment and committed; every freeze after it must reproduce its digest or is refused with both
digests (a changed pre-registration is a new experiment id), and every later job and `verify`
check the frozen receipt against it.

What is anchored is the part of the freeze that is the same on every machine and every clone:
the sha256 of the target file's bytes (which holds the experiment id, the target, the protocol,
the budget). The rest of the freeze receipt is not: it records when it was frozen and the commit
it was frozen at.

The code that decides the answer (trainer, environments, evaluation, analysis, pipeline:
envab/codepins.py) is *named* by the anchor: the experiment's first freeze writes every pinned
file's digest into it (`register_code`), and every later freeze records, in its code receipt,
which files differ from that registered code, and `verify` lists them (`DIFFERS`). Named, not
refused: a fresh clone at a later commit must still be able to run the shipped default, and a
skeptic must be able to see that it ran other code than was registered, and which.
"""

from __future__ import annotations

import json
from pathlib import Path

from envab.hashing import sha256_file
from envab.io import atomic_write_json
from envab.schema import ConfigError

FOLDER = "anchors"


class AnchorContradicted(ConfigError):
    """A freeze (or a frozen receipt) whose pre-registration digest is not the anchored one."""


def anchor_path(target: str | Path, experiment_id: str) -> Path:
    """Where the anchor of an experiment lives: beside its target file, in anchors/."""
    return Path(target).parent / FOLDER / f"{experiment_id}.json"


def named_by(statement: dict) -> str | None:
    """The anchor a pre-registration's freeze receipt answers to, relative to the workflow's
    folder: the one it names, or (a receipt frozen before anchors existed) the one beside its
    target file; None for a receipt that names no target."""
    try:
        predicate = statement["predicate"]
        if isinstance(predicate.get("anchor"), str):
            return predicate["anchor"]
        target = statement["subject"][0]["name"]
        return anchor_path(target, predicate["experiment_id"]).as_posix()
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


def anchored_digest(path: str | Path) -> str:
    """The pre-registration digest an anchor file records (ConfigError if it cannot be read)."""
    try:
        anchor = json.loads(Path(path).read_text())
        return anchor["preregistration"]["digest"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: not a readable anchor ({type(e).__name__})") from None


def contradiction(path: Path, experiment_id: str, anchored: str, now: str, what: str) -> str:
    return (
        f"{what} of experiment '{experiment_id}' has sha256 {now}, but {path} anchors it at "
        f"{anchored}: an experiment is frozen once. Restore the anchored pre-registration, or "
        "register a new experiment by giving it a new experiment_id."
    )


def check_or_anchor(target: str | Path, experiment_id: str) -> tuple[Path, bool]:
    """At a freeze: refuse a target whose digest contradicts the experiment's anchor; write the
    anchor on the experiment's first freeze. Returns the anchor's path and whether it was written
    now (to be committed)."""
    path = anchor_path(target, experiment_id)
    now = sha256_file(target)
    if path.is_file():
        anchored = anchored_digest(path)
        if anchored != now:
            raise AnchorContradicted(
                contradiction(path, experiment_id, anchored, now, f"the freeze of {target}")
            )
        return path, False
    atomic_write_json(
        path,
        {
            "experiment_id": experiment_id,
            "preregistration": {
                "name": Path(target).name,
                "digest": {"sha256": now},
            },
            # no time or machine in it: a clone at any later commit reproduces it
            "note": "written by the experiment's first freeze; commit it (envab/anchor.py)",
        },
    )
    return path, True


def check_receipt(target: str | Path, experiment_id: str, frozen: str) -> Path | None:
    """Refuse a frozen receipt (its recorded target digest `frozen`) that contradicts the anchor;
    the anchor's path, or None where there is none."""
    path = anchor_path(target, experiment_id)
    if not path.is_file():
        return None
    anchored = anchored_digest(path)
    if anchored != frozen:
        raise AnchorContradicted(
            contradiction(path, experiment_id, anchored, frozen, "the frozen receipt")
        )
    return path


def register_code(target: str | Path, experiment_id: str, files: dict[str, str]) -> Path | None:
    """At the experiment's first freeze: write the code pins' digests (path -> sha256) into its
    anchor, as the code the experiment was registered with. None where there is no anchor."""
    path = anchor_path(target, experiment_id)
    if not path.is_file():
        return None
    anchored = json.loads(path.read_text())
    anchored["code"] = {"files": dict(sorted(files.items()))}
    atomic_write_json(path, anchored)
    return path


def registered_code(target: str | Path, experiment_id: str) -> dict[str, str] | None:
    """The code an experiment was registered with (path -> sha256), from its anchor; None for an
    anchor from before code was registered, or none at all."""
    path = anchor_path(target, experiment_id)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())["code"]["files"]
    except (ValueError, KeyError, TypeError):
        return None


def code_differences(registered: dict[str, str], now: dict[str, str]) -> list[str]:
    """The pinned files whose digest differs from the registered code's (added or removed too),
    named by the repository-relative path (a `../` prefix of a workflow run elsewhere dropped)."""
    plain = {repository_path(p): d for p, d in now.items()}
    return sorted(p for p in registered.keys() | plain.keys() if registered.get(p) != plain.get(p))


def repository_path(path: str) -> str:
    while path.startswith("../"):
        path = path[3:]
    return path
