"""Receipts and `verify`: every kind of tampering is named, and only a clean folder passes."""

from __future__ import annotations

import json

import pytest

from envab import verify
from envab.receipts import FREEZE_RECEIPTS, subject, write_receipt


@pytest.fixture
def frozen(tmp_path, monkeypatch):
    """A small receipts folder: a base receipt and one that depends on it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("alpha\n")
    (tmp_path / "data" / "b.txt").write_text("beta\n")
    receipts = tmp_path / "receipts" / "exp"
    for name in FREEZE_RECEIPTS:  # what every experiment's folder holds (verify requires them)
        write_receipt(receipts / name, "freeze", [], {})
    write_receipt(receipts / "base.json", "base", [subject("data/a.txt")], {"note": "first"})
    write_receipt(
        receipts / "next.json",
        "next",
        [subject("data/b.txt")],
        {"note": "second"},
        depends_on=["receipts/exp/base.json"],
    )
    return tmp_path


def statuses(capsys) -> tuple[int, list[str]]:
    code = verify.main(["receipts/exp"])
    return code, capsys.readouterr().out.splitlines()


def flip_byte(path, offset: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_clean_receipts_verify(frozen, capsys):
    code, lines = statuses(capsys)
    assert code == 0
    # the four freeze receipts, two receipts themselves, their two subjects, one dependency
    assert sum(line.startswith("ok ") for line in lines) == 9
    assert lines[-1].startswith("verify: 9 ok, 0 failed")


def test_flipped_subject_byte_is_a_named_mismatch(frozen, capsys):
    flip_byte(frozen / "data" / "b.txt")
    code, lines = statuses(capsys)
    assert code == 1
    assert [line.split()[:2] for line in lines if not line.startswith(("ok", "verify"))] == [
        ["MISMATCH", "data/b.txt"]
    ]


def test_missing_subject_is_named(frozen, capsys):
    (frozen / "data" / "a.txt").unlink()
    code, lines = statuses(capsys)
    assert code == 1
    assert any(line.startswith("MISSING") and "data/a.txt" in line for line in lines)


def test_edited_receipt_shows_itself_and_where_it_is_depended_on(frozen, capsys):
    path = frozen / "receipts" / "exp" / "base.json"
    statement = json.loads(path.read_text())
    statement["predicate"]["note"] = "rewritten"
    path.write_text(json.dumps(statement))
    code, lines = statuses(capsys)
    assert code == 1
    failed = [line for line in lines if line.startswith("MISMATCH")]
    assert len(failed) == 2
    assert any("(the receipt itself)" in line for line in failed)
    assert any("(depends_on of receipts/exp/next.json)" in line for line in failed)


def test_unreadable_receipt_is_malformed(frozen, capsys):
    (frozen / "receipts" / "exp" / "next.json").write_text("{not json")
    code, lines = statuses(capsys)
    assert code == 1
    assert any(line.startswith("MALFORMED") and "next.json" in line for line in lines)


def test_empty_folder_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "receipts" / "exp").mkdir(parents=True)
    code, lines = statuses(capsys)
    assert code == 1 and lines[0].startswith("MISSING")


def test_a_flipped_byte_in_a_checkpoint_file_is_named(tmp_path, monkeypatch, capsys):
    """checkpoints.jsonl vouches for the files of every checkpoint it lists; verify checks them."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "results" / "run"
    weights = run / "checkpoints" / "valid-000016" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"weights")
    digest = subject(weights)["digest"]["sha256"]
    line = {"checkpoint": "valid-000016", "files": {"model.safetensors": digest}}
    (run / "checkpoints.jsonl").write_text(json.dumps(line) + "\n")
    receipt = tmp_path / "receipts" / "exp" / "outcome.json"
    for name in FREEZE_RECEIPTS:
        write_receipt(receipt.parent / name, "freeze", [], {})
    write_receipt(receipt, "outcome", [subject("results/run/checkpoints.jsonl")], {})
    weights_name = "results/run/checkpoints/valid-000016/model.safetensors"
    code, lines = statuses(capsys)
    assert code == 0
    assert f"ok        {weights_name}  (checkpoint file of receipts/exp/outcome.json)" in lines
    flip_byte(weights)
    code, lines = statuses(capsys)
    assert code != 0 and any(x.startswith(f"MISMATCH  {weights_name}") for x in lines), lines
    weights.unlink()
    assert any(x.startswith(f"MISSING   {weights_name}") for x in statuses(capsys)[1])
