"""A run's bundle (envab/bundle.py) verifies from anywhere: what it ships is checked byte for byte,
what it leaves out (weights) is NOT SHIPPED with its digest, and a tampered or deleted shipped
file still fails."""

from __future__ import annotations

import json
import os
from pathlib import Path

from envab import bundle, verify
from envab.receipts import FREEZE_RECEIPTS, subject, write_receipt

EXP = "exp-1"


def a_run(root: Path) -> None:
    """A run folder with a receipt whose subjects include a checkpoints.jsonl and its weights."""
    run = root / "results" / EXP / "drums" / "seed1"
    (run / "checkpoints" / "valid-000000").mkdir(parents=True)
    weights = run / "checkpoints" / "valid-000000" / "model.safetensors"
    weights.write_bytes(os.urandom(4096))
    (run / "checkpoints" / "valid-000000" / "config.json").write_text("{}")
    record = {
        "checkpoint": "valid-000000",
        "files": {
            "model.safetensors": subject(weights)["digest"]["sha256"],
            "config.json": subject(run / "checkpoints/valid-000000/config.json")["digest"][
                "sha256"
            ],
        },
    }
    (run / "checkpoints.jsonl").write_text(json.dumps(record) + "\n")
    (run / "run.json").write_text('{"valid": 2048}')
    receipts = root / "receipts" / EXP
    receipts.mkdir(parents=True)
    cwd = Path.cwd()
    os.chdir(root)  # receipts name paths relative to the workflow folder
    try:
        names = [Path(f"results/{EXP}/drums/seed1/{n}") for n in ("checkpoints.jsonl", "run.json")]
        write_receipt(f"receipts/{EXP}/run.json", "run", [subject(n) for n in names], {})
        for name in FREEZE_RECEIPTS:  # what every experiment's folder must hold
            write_receipt(f"receipts/{EXP}/{name}", "freeze", [], {})
    finally:
        os.chdir(cwd)


def statuses(checks) -> dict[str, str]:
    return {c.path: c.status for c in checks}


def test_a_bundle_verifies_and_says_what_it_left_out(tmp_path, capsys):
    a_run(tmp_path / "run")
    out = tmp_path / "bundle"
    assert bundle.main([EXP, "--out", str(out), "--root", str(tmp_path / "run")]) == 0
    weights = f"results/{EXP}/drums/seed1/checkpoints/valid-000000/model.safetensors"
    assert not (out / weights).exists() and weights in json.loads(
        (out / "not-shipped.json").read_text()
    )
    capsys.readouterr()
    assert verify.main([str(out / "receipts" / EXP), "--root", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"NOT SHIPPED {weights}" in printed
    assert "verify: 8 ok, 1 not shipped (digest only), 0 failed;" in printed


def test_a_tampered_or_deleted_file_in_a_bundle_still_fails(tmp_path):
    a_run(tmp_path / "run")
    out = tmp_path / "bundle"
    bundle.bundle(EXP, out, tmp_path / "run")
    run_json = out / "results" / EXP / "drums" / "seed1" / "run.json"
    run_json.write_text('{"valid": 4096}')
    checks = verify.verify_dir(out / "receipts" / EXP, out)
    assert statuses(checks)[f"results/{EXP}/drums/seed1/run.json"] == "MISMATCH"
    run_json.unlink()
    checks = verify.verify_dir(out / "receipts" / EXP, out)
    assert statuses(checks)[f"results/{EXP}/drums/seed1/run.json"] == "MISSING"
    # a weights file whose kept digest is not the receipt's is missing, not "not shipped"
    kept = json.loads((out / "not-shipped.json").read_text())
    for entry in kept.values():
        entry["sha256"] = "0" * 64
    (out / "not-shipped.json").write_text(json.dumps(kept))
    assert "NOT SHIPPED" not in statuses(verify.verify_dir(out / "receipts" / EXP, out)).values()


def test_the_shipped_bundle_verifies_from_a_clone(capsys):
    """tests/fixtures/bundle-test-small-v1: a bundle of the small run whose digests
    .test/digests.yaml records, as `python -m envab.bundle` writes it."""
    shipped = Path(__file__).resolve().parent / "fixtures" / "bundle-test-small-v1"
    receipts = shipped / "receipts" / "test-small-v1"
    assert verify.main([str(receipts), "--root", str(shipped)]) == 0
    printed = capsys.readouterr().out
    assert " 0 failed" in printed and "not shipped (digest only)" in printed
    checks = verify.verify_dir(receipts, shipped)
    weights = [c for c in checks if c.path.endswith("model.safetensors")]
    assert weights and {c.status for c in weights} == {"NOT SHIPPED"}
