"""The freeze's anchor: a committed digest of the pre-registration outside the receipts folder.
Deleting the receipts and freezing again from another target is refused at the freeze with both
digests; a receipt forged to match another target is refused by every later job and shown by
`verify`; the shipped anchors are what a fresh clone's freeze reproduces."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from envab import anchor, freeze, verify
from envab.hashing import sha256_file
from envab.receipts import statement_digest, subject, write_receipt

REPO = Path(__file__).resolve().parent.parent
EXP = "anchor-test-v1"
TARGET = "prereg/target.yaml"
RECEIPT = Path("receipts") / EXP / "preregistration.json"
ANCHOR = Path("prereg") / "anchors" / f"{EXP}.json"


def write_target(root: Path, experiment_id: str = EXP, threshold: float | None = None) -> Path:
    """The shipped target.yaml under another experiment id (and threshold, if given)."""
    target = yaml.safe_load((REPO / "preregistration" / "target.yaml").read_text())
    target["experiment_id"] = experiment_id
    if threshold is not None:
        target["target"]["threshold"] = threshold
    path = root / TARGET
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(target, sort_keys=False))
    return path


@pytest.fixture
def frozen(tmp_path, monkeypatch, capsys):
    """A first freeze, by the freeze's own command line."""
    monkeypatch.chdir(tmp_path)
    write_target(tmp_path)
    assert freeze.main(["target", TARGET]) == 0
    return capsys.readouterr().out


def test_the_first_freeze_writes_the_anchor_to_commit(frozen):
    assert f"anchored: {ANCHOR} (commit it)" in frozen
    assert anchor.anchored_digest(ANCHOR) == sha256_file(TARGET)
    predicate = json.loads(RECEIPT.read_text())["predicate"]
    assert predicate["anchor"] == ANCHOR.as_posix()
    # no time and no machine in the anchor: a clone at a later commit reproduces it
    assert set(json.loads(ANCHOR.read_text())) == {"experiment_id", "preregistration", "note"}


def test_a_redone_freeze_with_another_target_is_refused_with_both_digests(frozen, capsys):
    anchored = sha256_file(TARGET)
    shutil.rmtree("receipts")  # the receipts deleted ...
    write_target(Path("."), threshold=0.85)  # ... and the target changed under the same id
    changed = sha256_file(TARGET)
    assert freeze.main(["target", TARGET]) == 2
    err = capsys.readouterr().err
    assert anchored in err and changed in err and str(ANCHOR) in err
    assert "new experiment_id" in err
    assert not RECEIPT.exists()  # refused before anything was written
    assert anchor.anchored_digest(ANCHOR) == anchored  # and the anchor is not rewritten


def test_a_redone_freeze_of_the_same_target_is_accepted(frozen, capsys):
    shutil.rmtree("receipts")
    assert freeze.main(["target", TARGET]) == 0
    assert "anchored:" not in capsys.readouterr().out  # the anchor was there already
    assert json.loads(RECEIPT.read_text())["subject"][0]["digest"]["sha256"] == (
        anchor.anchored_digest(ANCHOR)
    )


def test_a_changed_target_registers_under_a_new_experiment_id(frozen, capsys):
    write_target(Path("."), experiment_id="anchor-test-v2", threshold=0.85)
    assert freeze.main(["target", TARGET]) == 0
    new = Path("prereg") / "anchors" / "anchor-test-v2.json"
    assert anchor.anchored_digest(new) == sha256_file(TARGET) != anchor.anchored_digest(ANCHOR)


def forge_receipt() -> None:
    """The receipt rewritten to the current target, its digests recomputed consistently."""
    statement = json.loads(RECEIPT.read_text())
    statement["subject"] = [subject(TARGET)]
    statement["predicate"]["statement_sha256"] = statement_digest(statement)
    RECEIPT.write_text(json.dumps(statement))


def test_a_receipt_forged_to_another_target_is_refused_by_later_jobs(frozen, capsys):
    write_target(Path("."), threshold=0.85)
    forge_receipt()
    code = ["code", "--target", TARGET, "--receipts", str(RECEIPT)]
    assert freeze.main([*code, "--receipt", "c.json"]) == 2
    assert "anchors it at" in capsys.readouterr().err
    assert not Path("c.json").exists()


def test_verify_checks_the_freeze_against_its_anchor(frozen, capsys):
    assert verify.main([str(RECEIPT.parent)]) == 0
    out = capsys.readouterr().out
    assert f"ok        {ANCHOR}  (anchor of {RECEIPT})" in out
    write_target(Path("."), threshold=0.85)
    forge_receipt()
    assert verify.main([str(RECEIPT.parent)]) == 1
    assert f"MISMATCH  {ANCHOR}  (anchor of {RECEIPT})" in capsys.readouterr().out
    ANCHOR.unlink()  # the receipt names its anchor: gone is a deletion, not an old freeze
    assert verify.main([str(RECEIPT.parent)]) == 1
    assert f"MISSING   {ANCHOR}  (anchor of {RECEIPT})" in capsys.readouterr().out


def test_a_freeze_from_before_anchors_is_said_to_be_unanchored(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_target(tmp_path)
    # what the freeze wrote before anchors existed: no `anchor`, none beside the target
    write_receipt(RECEIPT, "preregistration", [subject(TARGET)], {"experiment_id": EXP})
    assert verify.main([str(RECEIPT.parent)]) == 0
    out = capsys.readouterr().out
    assert f"NO ANCHOR {ANCHOR}" in out and "the freeze not anchored, 0 failed" in out


@pytest.mark.parametrize(
    "target", ["preregistration/target.yaml", ".test/target.yaml"], ids=["default", "test"]
)
def test_a_fresh_clone_reproduces_the_shipped_anchor(target, tmp_path, monkeypatch, capsys):
    """The committed anchors of the shipped default and of `.test` are the sha256 of the
    committed targets, and a freeze in a copy of the repository's files (as a fresh clone) is
    accepted against them."""
    source = REPO / target
    shutil.copytree(source.parent, tmp_path / source.parent.name, ignore=_only_targets)
    monkeypatch.chdir(tmp_path)
    copied = Path(source.parent.name) / source.name
    exp = yaml.safe_load(copied.read_text())["experiment_id"]
    committed = anchor.anchor_path(copied, exp)
    assert committed.is_file(), f"{target}: no committed anchor"
    assert anchor.anchored_digest(committed) == sha256_file(source)
    assert freeze.main(["target", str(copied)]) == 0
    assert "anchored:" not in capsys.readouterr().out


def _only_targets(folder, names):
    """A clone's pre-registration files: the targets and the anchors, nothing a run wrote."""
    return {n for n in names if n in ("receipts", "results", "logs", ".snakemake", "benchmarks")}
