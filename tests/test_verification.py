"""The verification page of the report: every receipt's digests and the `verify` result, on a real
freeze, and a tampered subject named on the page and in the exit status."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import SHIPPED_EXP as EXP

from envab import verify
from envab.receipts import FREEZE_RECEIPTS

RECEIPTS = Path("receipts") / EXP
PAGE = Path("results") / EXP / "verification.html"


def receipt_files() -> list[str]:
    return [(RECEIPTS / name).as_posix() for name in FREEZE_RECEIPTS]


def recorded_digests(root: Path) -> set[str]:
    """Every digest the freeze receipts record: their subjects, dependencies, and themselves."""
    digests = set()
    for name in receipt_files():
        statement = json.loads((root / name).read_text())
        entries = statement["subject"] + statement["predicate"]["depends_on"]
        digests |= {e["digest"]["sha256"] for e in entries}
        digests.add(statement["predicate"]["statement_sha256"])
    return digests


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))


def test_page_lists_every_digest_and_says_all_ok(frozen, monkeypatch, capsys):
    monkeypatch.chdir(frozen.root)
    assert verify.main(["--receipts", *receipt_files(), "--html", str(PAGE)]) == 0
    page = PAGE.read_text()
    checks = verify.verify_dir(RECEIPTS)
    # every check ok, but the pinned files that differ from the registered code (named, not
    # failed: a clone at a later commit than the registration's)
    named = [c for c in checks if c.status == verify.DIFFERS]
    assert all(c.ok for c in checks if c not in named)
    assert f"verify: {len(checks) - len(named)} ok" in page and ", 0 failed" in page
    assert "MISMATCH" not in page and "MISSING" not in page
    assert f"python -m envab.verify {RECEIPTS.as_posix()}" in page
    assert all(digest in page for digest in recorded_digests(frozen.root))
    assert all(name in page for name in receipt_files())


def test_frame_has_one_row_per_check_with_the_recorded_digest(frozen, monkeypatch):
    monkeypatch.chdir(frozen.root)
    checks = verify.verify_receipts([Path(f) for f in receipt_files()])
    frame = verify.checks_frame(checks)
    assert list(frame.columns) == ["receipt", "role", "path", "sha256", "status"]
    assert len(frame) == len(checks) == len(verify.verify_dir(RECEIPTS))
    # a row naming a file that differs from the registered code records no digest of its own
    recorded = frame[frame["role"] != "registered code"]
    assert recorded["sha256"].str.fullmatch("[0-9a-f]{64}").all()
    assert set(recorded["sha256"]) == recorded_digests(frozen.root)


def test_tampered_subject_is_a_mismatch_on_the_page_and_fails_the_cli(frozen):
    heldout = Path("results") / EXP / "tasks" / "heldout.jsonl"  # a subject of split.json
    flip_byte(frozen.root / heldout)
    args = ["--receipts", *receipt_files(), "--html", str(PAGE)]
    result = frozen.python("-m", "envab.verify", *args)
    assert result.returncode == 1, result.stdout[-2000:]
    page = (frozen.root / PAGE).read_text()  # written although the command failed
    assert "1 failed" in page
    assert f"MISMATCH {heldout.as_posix()}" in page  # named in the summary
    assert "<td>MISMATCH</td>" in page  # and in its row of the table


def test_page_escapes_what_the_receipts_name():
    check = verify.Check("MISSING", "<script>x</script>", "r.json", "subject", "0" * 64)
    page = verify.verification_html([check], "receipts/exp")
    assert "<script>" not in page and "&lt;script&gt;" in page
