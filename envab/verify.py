"""Recheck every digest in receipts/<experiment>/ against the files: one line per item.

    python -m envab.verify receipts/embedded-default-v5

Prints ``ok`` / ``MISMATCH`` / ``MISSING`` / ``MALFORMED`` with the path for every subject and every
receipt a receipt depends on, and exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from envab.hashing import sha256_file
from envab.receipts import read_receipt, statement_digest


@dataclass(frozen=True)
class Check:
    status: str  # ok | MISMATCH | MISSING | MALFORMED
    path: str
    receipt: str
    role: str  # subject | depends_on | receipt

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def line(self) -> str:
        if self.role == "receipt":
            return f"{self.status:<9} {self.path}  (the receipt itself)"
        return f"{self.status:<9} {self.path}  ({self.role} of {self.receipt})"


def _check_digest(entry: dict, root: Path, receipt: str, role: str) -> Check:
    name = entry.get("name", "?")
    expected = entry.get("digest", {}).get("sha256")
    path = root / name
    if not expected:
        return Check("MALFORMED", name, receipt, role)
    if not path.is_file():
        return Check("MISSING", name, receipt, role)
    status = "ok" if sha256_file(path) == expected else "MISMATCH"
    return Check(status, name, receipt, role)


def verify_dir(receipts: str | Path, root: str | Path = ".") -> list[Check]:
    """Every check for every receipt in the folder `receipts` (paths inside are relative to
    `root`)."""
    receipts = Path(receipts)
    files = sorted(receipts.glob("*.json"))
    if not files:
        return [Check("MISSING", receipts.as_posix(), receipts.as_posix(), "receipt")]
    return verify_receipts(files, root)


def verify_receipts(files: list[Path], root: str | Path = ".") -> list[Check]:
    """Every check for each receipt file in `files`."""
    root = Path(root)
    checks = []
    for file in files:
        name = Path(file).as_posix()
        if not Path(file).is_file():
            checks.append(Check("MISSING", name, name, "receipt"))
            continue
        try:
            statement = read_receipt(file)
            subjects = statement["subject"]
            depends_on = statement["predicate"]["depends_on"]
            intact = statement["predicate"]["statement_sha256"] == statement_digest(statement)
        except (ValueError, KeyError, TypeError):
            checks.append(Check("MALFORMED", name, name, "receipt"))
            continue
        checks.append(Check("ok" if intact else "MISMATCH", name, name, "receipt"))
        checks += [_check_digest(s, root, name, "subject") for s in subjects]
        checks += [_check_digest(d, root, name, "depends_on") for d in depends_on]
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("receipts", help="receipts/<experiment_id>")
    parser.add_argument("--root", default=".", help="directory the receipt paths are relative to")
    args = parser.parse_args(argv)
    checks = verify_dir(args.receipts, args.root)
    for check in checks:
        print(check.line())
    failed = [c for c in checks if not c.ok]
    print(f"verify: {len(checks) - len(failed)} ok, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
