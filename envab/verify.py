"""Recheck every digest in receipts/<experiment>/ against the files: one line per item.

    python -m envab.verify receipts/embedded-default-v8
    python -m envab.verify --receipts receipts/embedded-default-v8/*.json --html verification.html

Prints ``ok`` / ``MISMATCH`` / ``MISSING`` / ``MALFORMED`` with the path for every subject and every
receipt a receipt depends on, and exits non-zero on any failure. A folder must hold what its
experiment's jobs write: the freeze receipts, and each finished run's training-records receipt
where the freeze says runs leave one (envab/run_receipts.py); each absent one is ``MISSING``,
named with what requires it. The pre-registration's freeze receipt is checked against the
experiment's committed anchor (envab/anchor.py): ``MISMATCH`` when they disagree, ``MISSING`` when
the receipt names an anchor that is gone, ``NO ANCHOR`` (neither ok nor failed) for a receipt
frozen before anchors existed with none beside its target. In a bundle (envab/bundle.py) a
file deliberately left out (model weights) is ``NOT SHIPPED``: its digest is the receipt's, its
bytes are not there to check; counted on its own, neither ok nor failed. A subject that is a run's
checkpoints.jsonl vouches for the files it lists, so each saved checkpoint's files
(checkpoints/<name>/<file>, next to it) are checked against the digests recorded there too.
``--html`` also writes the checks as a page for the Snakemake report (written before the exit
status, so a failure shows there).
"""

from __future__ import annotations

import argparse
import html
import json
import os
import shlex
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from envab import anchor, run_receipts, signing
from envab.bundle import NOT_SHIPPED_STATUS, not_shipped
from envab.errors import Refusal, refused
from envab.hashing import sha256_file
from envab.io import atomic_write_text
from envab.receipts import FREEZE_RECEIPTS, read_receipt, statement_digest
from envab.schema import ConfigError

if TYPE_CHECKING:
    import pandas as pd


NO_ANCHOR = "NO ANCHOR"  # a freeze from before anchors, none beside its target: not checked
# A subject this process must not open (the held-out split, in a training process): its digest is
# checked by the jobs that may read it (the judge, evaluation, `verify` itself).
NOT_READ = "NOT READ"
# A pinned file that differs from the code the experiment was registered with (its anchor): named
# for the reviewer, not a failure (a later commit may run a registration; the reader judges).
DIFFERS = "DIFFERS"


@dataclass(frozen=True)
class Check:
    status: (
        str  # ok | MISMATCH | MISSING | MALFORMED | NOT SHIPPED | NO ANCHOR | NOT READ | DIFFERS
    )
    path: str
    receipt: str  # for a required receipt: the file that requires it
    role: str  # subject | depends_on | receipt | signature | checkpoint file | anchor | required
    sha256: str | None = None  # the digest the receipt records; None where it records none

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def failed(self) -> bool:
        return self.status not in ("ok", NOT_SHIPPED_STATUS, NO_ANCHOR, NOT_READ, DIFFERS)

    def line(self) -> str:
        if self.role == "receipt":
            return f"{self.status:<9} {self.path}  (the receipt itself)"
        if self.role == "required":
            return f"{self.status:<9} {self.path}  (required by {self.receipt})"
        if self.role == "signature":
            return f"{self.status:<9} {self.path}{signing.SUFFIX}  (its signature)"
        return f"{self.status:<9} {self.path}  ({self.role} of {self.receipt})"


class Digests:
    """sha256 of files, each read once however many receipts name it, hashed in parallel
    (hashlib releases the GIL on large updates, so threads use every core)."""

    def __init__(self, workers: int | None = None, not_shipped: dict[str, str] | None = None):
        self.workers = workers or os.cpu_count() or 1
        self._known: dict[Path, str] = {}
        self.not_shipped = not_shipped or {}  # a bundle's left-out files: name -> kept digest

    def prefetch(self, paths) -> None:
        todo = sorted({p for p in paths if p not in self._known and p.is_file()})
        if len(todo) <= 1 or self.workers == 1:
            self._known.update((p, sha256_file(p)) for p in todo)
            return
        with ThreadPoolExecutor(self.workers) as pool:
            self._known.update(zip(todo, pool.map(sha256_file, todo), strict=True))

    def __call__(self, path: Path) -> str:
        if path not in self._known:
            self._known[path] = sha256_file(path)
        return self._known[path]


def _check_digest(entry: dict, root: Path, receipt: str, role: str, digests: Digests) -> Check:
    name = entry.get("name", "?")
    expected = entry.get("digest", {}).get("sha256")
    path = root / name
    if not expected:
        return Check("MALFORMED", name, receipt, role)
    if not path.is_file():
        if digests.not_shipped.get(name) == expected:
            return Check(NOT_SHIPPED_STATUS, name, receipt, role, expected)
        return Check("MISSING", name, receipt, role, expected)
    status = "ok" if digests(path) == expected else "MISMATCH"
    return Check(status, name, receipt, role, expected)


def _checkpoint_entries(records: Path, root: Path) -> list[dict | None]:
    """What a checkpoints.jsonl lists: an entry per checkpoint file, None for a malformed line."""
    entries = []
    for line in records.read_text().splitlines():
        try:
            entry = json.loads(line)
            folder = records.parent / "checkpoints" / entry["checkpoint"]
            files = entry["files"].items()
        except (ValueError, KeyError, AttributeError):
            entries.append(None)
            continue
        for relative, digest in sorted(files):
            name = (folder / relative).relative_to(root).as_posix()
            entries.append({"name": name, "digest": {"sha256": digest}})
    return entries


def _checkpoint_files(records: Path, root: Path, receipt: str, digests: Digests) -> list[Check]:
    """The files every line of a checkpoints.jsonl records, checked against their digests."""
    checks = []
    for entry in _checkpoint_entries(records, root):
        if entry is None:
            name = records.relative_to(root).as_posix() if records.is_relative_to(root) else records
            checks.append(Check("MALFORMED", str(name), receipt, "checkpoint file"))
        else:
            checks.append(_check_digest(entry, root, receipt, "checkpoint file", digests))
    return checks


def verify_dir(receipts: str | Path, root: str | Path = ".", public_key=None) -> list[Check]:
    """Every check for every receipt in the folder `receipts` (paths inside are relative to
    `root`). What the freeze must have written is there or MISSING, not unnoticed: the
    pre-registration's receipt always, and all four freeze receipts once anything later is."""
    receipts = Path(receipts)
    # the registration's receipts, and each selection's answer (arm=, seed=) under selections/
    files = sorted(receipts.glob("*.json")) + sorted(receipts.glob("selections/*/*.json"))
    if not files:
        return [Check("MISSING", receipts.as_posix(), receipts.as_posix(), "receipt")]
    later = any(f.name not in FREEZE_RECEIPTS for f in files)
    required = FREEZE_RECEIPTS if later else FREEZE_RECEIPTS[:1]
    absent = [receipts / name for name in required if not (receipts / name).is_file()]
    # each finished run's training-records receipt, where the freeze says runs leave one
    runs = [
        Check("MISSING", path, by, "required") for path, by in run_receipts.missing(receipts, root)
    ]
    return runs + verify_receipts([*absent, *files], root, public_key=public_key)


def verify_receipts(
    files: list[Path],
    root: str | Path = ".",
    workers: int | None = None,
    public_key=None,
    unread: Callable[[str], bool] | None = None,
) -> list[Check]:
    """Every check for each receipt file in `files`. Every file the receipts (and the
    checkpoints.jsonl among their subjects) name is hashed first, once, in parallel; the checks
    then read the digests in the receipts' order. A subject whose name `unread` accepts is
    never opened: it is listed NOT READ (the held-out split, where a training process checks)."""
    root = Path(root)
    unread = unread or (lambda name: False)
    statements: list[tuple[str, dict | None]] = []
    for file in files:
        name = Path(file).as_posix()
        try:
            statements.append((name, read_receipt(file) if Path(file).is_file() else None))
        except (ValueError, KeyError, TypeError):
            statements.append((name, {}))
    digests = Digests(workers, not_shipped(root))
    named = [
        root / entry["name"]
        for _, statement in statements
        if isinstance(statement, dict)
        for entry in _entries(statement)
        if isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and not unread(entry["name"])
    ]
    digests.prefetch(named)
    listed = [
        root / entry["name"]
        for path in named
        if path.name == "checkpoints.jsonl" and path.is_file()
        for entry in _checkpoint_entries(path, root)
        if entry is not None
    ]
    digests.prefetch(listed)

    checks = []
    for name, statement in statements:
        if statement is None:
            checks.append(Check("MISSING", name, name, "receipt"))
            continue
        try:
            subjects = statement["subject"]
            depends_on = statement["predicate"]["depends_on"]
            recorded = statement["predicate"]["statement_sha256"]
            intact = recorded == statement_digest(statement)
        except (ValueError, KeyError, TypeError):
            checks.append(Check("MALFORMED", name, name, "receipt"))
            continue
        checks.append(Check("ok" if intact else "MISMATCH", name, name, "receipt", recorded))
        if public_key is not None:  # a rewritten, re-hashed receipt fails here
            checks.append(
                Check(signing.check(name, statement, public_key), name, name, "signature")
            )
        anchored = _anchor_check(name, statement, root)
        if anchored is not None:
            checks.append(anchored)
        differs = statement["predicate"].get("differs_from_registered") or []
        checks += [Check(DIFFERS, path, name, "registered code") for path in differs]
        for subject_entry in subjects:
            if isinstance(subject_entry, dict) and unread(str(subject_entry.get("name"))):
                checks.append(Check(NOT_READ, str(subject_entry["name"]), name, "subject"))
                continue
            check = _check_digest(subject_entry, root, name, "subject", digests)
            checks.append(check)
            if check.ok and Path(check.path).name == "checkpoints.jsonl":
                checks += _checkpoint_files(root / check.path, root, name, digests)
        checks += [_check_digest(d, root, name, "depends_on", digests) for d in depends_on]
    return checks


def _anchor_check(name: str, statement: dict, root: Path) -> Check | None:
    """A pre-registration's freeze receipt against the experiment's committed anchor: a receipt
    deleted and frozen again from another target disagrees with it. None for other receipts."""
    if not str(statement.get("predicateType", "")).endswith("/preregistration/v1"):
        return None
    relative = anchor.named_by(statement)
    if relative is None:
        return None  # names no target: its subjects' checks report that
    path = root / relative
    if not path.is_file():
        # a receipt that names its anchor was frozen with one: its absence is a deletion
        named = isinstance(statement["predicate"].get("anchor"), str)
        return Check("MISSING" if named else NO_ANCHOR, relative, name, "anchor")
    try:
        anchored = anchor.anchored_digest(path)
        frozen = statement["subject"][0]["digest"]["sha256"]
    except (ConfigError, KeyError, IndexError, TypeError):
        return Check("MALFORMED", relative, name, "anchor")
    return Check("ok" if anchored == frozen else "MISMATCH", relative, name, "anchor", anchored)


def _entries(statement: dict) -> list:
    """A statement's subjects and dependencies, as far as they can be read (a malformed one is
    reported by the checks, not here)."""
    try:
        return [*statement["subject"], *statement["predicate"]["depends_on"]]
    except (KeyError, TypeError):
        return []


def verdict(checks: list[Check]) -> str:
    """The one-line result, e.g. ``verify: 12 ok, 0 failed`` (``, 3 not shipped`` in a bundle)."""
    failed = sum(c.failed for c in checks)
    left_out = sum(c.status == NOT_SHIPPED_STATUS for c in checks)
    shipped = f", {left_out} not shipped (digest only)" if left_out else ""
    unanchored = sum(c.status == NO_ANCHOR for c in checks)
    loose = ", the freeze not anchored" if unanchored else ""
    differs = sum(c.status == DIFFERS for c in checks)
    other = f", {differs} pinned files differ from the registered code" if differs else ""
    return f"verify: {sum(c.ok for c in checks)} ok{shipped}{loose}{other}, {failed} failed"


def checks_frame(checks: list[Check]) -> pd.DataFrame:
    """One row per check: which receipt, what role, the path, the digest it records, the status."""
    import pandas as pd  # only for the page and the report: a plain verify starts without it

    columns = ["receipt", "role", "path", "sha256", "status"]
    return pd.DataFrame([asdict(c) for c in checks], columns=columns)


PAGE = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 1em; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
th, td {{ border: 1px solid #ccc; padding: 2px 6px; text-align: left; }}
td {{ font-family: monospace; }}
</style></head>
<body>
<h2>{headline}</h2>
<p>{summary}</p>
<p>Recheck: <code>{command}</code> (or <code>snakemake --cores 1 verify</code>)</p>
{table}
</body>
</html>
"""


def verification_html(checks: list[Check], folder: str) -> str:
    """A self-contained page: the verdict, the command that rechecks it, the table of checks."""
    failed = [f"{c.status} {c.path}" for c in checks if c.failed]
    summary = f"Failed: {', '.join(failed)}." if failed else "Every digest matches."
    return PAGE.format(
        title=html.escape(verdict(checks)),
        headline=html.escape(verdict(checks)),
        summary=html.escape(summary),
        command=html.escape(f"python -m envab.verify {shlex.quote(folder)}"),
        table=checks_frame(checks).to_html(index=False, escape=True, na_rep=""),
    )


def receipt_folder(files: list[str]) -> str:
    """The folder a list of receipt files lives in: what a reviewer passes to recheck them."""
    return Path(os.path.commonpath([Path(f).parent.as_posix() for f in files])).as_posix()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("receipts", nargs="?", help="receipts/<experiment_id>")
    given.add_argument(
        "--receipts", dest="files", nargs="+", metavar="FILE", help="these receipt files instead"
    )
    parser.add_argument("--root", default=".", help="directory the receipt paths are relative to")
    parser.add_argument("--html", metavar="OUT", help="also write the checks as an HTML page")
    parser.add_argument(
        "--public-key", metavar="PEM", help="check each receipt's signature with this key"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        key = signing.load_public(args.public_key) if args.public_key else None
    except Refusal as e:
        return refused(e)
    if args.files:
        checks = verify_receipts([Path(f) for f in args.files], args.root, public_key=key)
        folder = receipt_folder(args.files)
    else:
        checks = verify_dir(args.receipts, args.root, public_key=key)
        folder = args.receipts
    for check in checks:
        print(check.line())
    print(verdict(checks) + ("" if key else "; signatures not checked (no --public-key)"))
    if args.html:  # before the exit status: a failed verify is what the page must show
        atomic_write_text(args.html, verification_html(checks, folder))
    return 1 if any(c.failed for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
