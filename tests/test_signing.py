"""Receipts a motivated actor cannot rewrite silently: a receipt rewritten with its digests
recomputed passes the digest checks and fails its signature; a deleted freeze receipt is
MISSING; the private key reaches no file but its own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from envab import signing, verify
from envab.receipts import FREEZE_RECEIPTS, statement_digest, subject, write_receipt

EXP = "exp-1"


@pytest.fixture
def keys(tmp_path):
    private, public = tmp_path / "keys" / "team.key", tmp_path / "keys" / "team.pub"
    private.parent.mkdir()
    assert signing.main(["keygen", "--private", str(private), "--public", str(public)]) == 0
    return private, public


def signed_run(root: Path, private: Path, monkeypatch) -> None:
    (root / "results").mkdir(parents=True)
    (root / "results" / "run.json").write_text('{"valid": 2048}')
    monkeypatch.chdir(root)
    monkeypatch.setenv(signing.KEY_ENV, str(private))
    (root / "receipts" / EXP).mkdir(parents=True)
    for name in FREEZE_RECEIPTS:
        write_receipt(f"receipts/{EXP}/{name}", "freeze", [], {})
    write_receipt(f"receipts/{EXP}/run.json", "run", [subject("results/run.json")], {})
    monkeypatch.delenv(signing.KEY_ENV)


def statuses(checks, role):
    return {Path(c.path).name: c.status for c in checks if c.role == role}


def test_signed_receipts_verify_with_the_public_key(tmp_path, keys, monkeypatch, capsys):
    signed_run(tmp_path / "run", keys[0], monkeypatch)
    assert verify.main([f"receipts/{EXP}", "--public-key", str(keys[1])]) == 0
    out = capsys.readouterr().out
    assert out.count("(its signature)") == len(FREEZE_RECEIPTS) + 1
    assert verify.main([f"receipts/{EXP}"]) == 0
    assert "signatures not checked (no --public-key)" in capsys.readouterr().out


def test_a_rewritten_and_rehashed_receipt_fails_its_signature(tmp_path, keys, monkeypatch):
    signed_run(tmp_path / "run", keys[0], monkeypatch)
    Path("results/run.json").write_text('{"valid": 4096}')  # the forged result ...
    receipt = Path(f"receipts/{EXP}/run.json")
    statement = json.loads(receipt.read_text())
    statement["subject"] = [subject("results/run.json")]  # ... its digest recomputed ...
    statement["predicate"]["statement_sha256"] = statement_digest(statement)  # ... and its own
    receipt.write_text(json.dumps(statement))
    public = signing.load_public(keys[1])
    plain = verify.verify_dir(f"receipts/{EXP}")
    assert all(c.ok for c in plain)  # digests alone cannot tell
    signed = verify.verify_dir(f"receipts/{EXP}", public_key=public)
    assert statuses(signed, "signature")["run.json"] == "NOT THIS RECEIPT"
    other = tmp_path / "other"
    other.mkdir()
    assert (
        signing.main(["keygen", "--private", str(other / "k"), "--public", str(other / "p")]) == 0
    )
    wrong = verify.verify_dir(f"receipts/{EXP}", public_key=signing.load_public(other / "p"))
    assert set(statuses(wrong, "signature").values()) == {"WRONG KEY"}


def test_a_deleted_freeze_receipt_is_missing(tmp_path, keys, monkeypatch):
    signed_run(tmp_path / "run", keys[0], monkeypatch)
    os.remove(f"receipts/{EXP}/split.json")
    checks = verify.verify_dir(f"receipts/{EXP}")
    assert statuses(checks, "receipt")["split.json"] == "MISSING"


def test_an_unsigned_receipt_fails_when_signatures_are_checked(tmp_path, keys, monkeypatch):
    signed_run(tmp_path / "run", keys[0], monkeypatch)
    write_receipt(f"receipts/{EXP}/late.json", "late", [], {})  # no key in the environment
    checks = verify.verify_dir(f"receipts/{EXP}", public_key=signing.load_public(keys[1]))
    assert statuses(checks, "signature")["late.json"] == "UNSIGNED"


def test_the_private_key_reaches_no_other_file(tmp_path, keys, monkeypatch):
    signed_run(tmp_path / "run", keys[0], monkeypatch)
    secret = keys[0].read_bytes()
    body = b"".join(secret.splitlines()[1:-1])  # the key's base64 body
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert body not in data and str(keys[0]).encode() not in data, path


def test_a_key_is_never_overwritten(keys, capsys):
    assert signing.main(["keygen", "--private", str(keys[0]), "--public", str(keys[1])]) == 2
    assert "is never overwritten" in capsys.readouterr().err
