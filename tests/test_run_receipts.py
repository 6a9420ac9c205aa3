"""The training-records receipt and the receipts a finished run must have: a run's records edited
after training are named by `verify`, a deleted training-records receipt is MISSING with what
requires it, and a receipt rewritten consistently after an edit is still caught by its
signature. The experiment is frozen by the freeze's own command line; the receipt is written by
the function the trainer calls at a run's end (tests/test_train.py checks the trainer writes it,
a resumed run included)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from envab import freeze, signing, verify
from envab.hashing import file_manifest
from envab.receipts import FREEZE_RECEIPTS, statement_digest, subject, write_receipt
from envab.run_receipts import training_receipt_name, write_training_receipt

REPO = Path(__file__).resolve().parent.parent
EXP = "records-test-v1"
RECEIPTS = Path("receipts") / EXP
RUN = Path("results") / EXP / "drums" / "seed1"
TRAINING = RECEIPTS / training_receipt_name("drums", 1)
RECORDS = ["pins.json", "trajectories.jsonl", "steps.jsonl", "checkpoints.jsonl", "run.json"]


def freeze_experiment(root: Path, run_receipts: bool = True) -> None:
    """The shipped target under a test id, frozen by the freeze's command line; the three later
    freeze receipts (their contents do not matter here)."""
    target = yaml.safe_load((REPO / "preregistration" / "target.yaml").read_text())
    target["experiment_id"] = EXP
    (root / "prereg").mkdir()
    (root / "prereg" / "target.yaml").write_text(yaml.safe_dump(target, sort_keys=False))
    assert freeze.main(["target", "prereg/target.yaml"]) == 0
    if not run_receipts:  # as an experiment frozen before run receipts existed
        path = RECEIPTS / "preregistration.json"
        statement = json.loads(path.read_text())
        del statement["predicate"]["run_receipts"]
        statement["predicate"]["statement_sha256"] = statement_digest(statement)
        path.write_text(json.dumps(statement))
    for name in FREEZE_RECEIPTS[1:]:
        write_receipt(RECEIPTS / name, "freeze", [], {}, depends_on=[RECEIPTS / FREEZE_RECEIPTS[0]])


def train(root: Path) -> dict:
    """What a finished run leaves in its folder, and its training-records receipt."""
    run = root / RUN
    weights = run / "checkpoints" / "valid-000002" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"weights")
    (run / "pins.json").write_text(json.dumps({"arm": "drums", "seed": 1}))
    attempts = [{"attempt": n, "verdict": "valid", "reward": n % 2} for n in range(4)]
    (run / "trajectories.jsonl").write_text("".join(json.dumps(a) + "\n" for a in attempts))
    (run / "steps.jsonl").write_text(json.dumps({"step": 1, "digest": "ab"}) + "\n")
    files = file_manifest(weights.parent)
    line = {"checkpoint": "valid-000002", "files": files}
    (run / "checkpoints.jsonl").write_text(json.dumps(line) + "\n")
    record = {
        "experiment_id": EXP,
        "arm": "drums",
        "seed": 1,
        "stop_reason": "budget_valid_trajectories",
        "valid_trajectories": 4,
        "checkpoints": 1,
        "restarts": [],
    }
    (run / "run.json").write_text(json.dumps(record))
    frozen = [RECEIPTS / name for name in FREEZE_RECEIPTS]
    write_training_receipt(TRAINING, [RUN / name for name in RECORDS], frozen, record)
    return record


@pytest.fixture
def trained(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    freeze_experiment(tmp_path)
    train(tmp_path)
    capsys.readouterr()
    return tmp_path


def run_verify(capsys, *args: str) -> tuple[int, list[str]]:
    code = verify.main([str(RECEIPTS), *args])
    return code, capsys.readouterr().out.splitlines()


def failed(lines: list[str]) -> list[str]:
    return [line for line in lines if not line.startswith(("ok", "verify:", "DIFFERS"))]


def test_a_finished_run_with_its_receipt_verifies(trained, capsys):
    code, lines = run_verify(capsys)
    assert code == 0, failed(lines)
    for name in RECORDS:
        assert f"ok        {RUN / name}  (subject of {TRAINING})" in lines
    weights = RUN / "checkpoints" / "valid-000002" / "model.safetensors"
    assert f"ok        {weights}  (checkpoint file of {TRAINING})" in lines
    predicate = json.loads(TRAINING.read_text())["predicate"]
    assert predicate["lines"] == {"trajectories.jsonl": 4, "steps.jsonl": 1, "checkpoints.jsonl": 1}


def test_a_deleted_training_records_receipt_is_missing(trained, capsys):
    TRAINING.unlink()
    code, lines = run_verify(capsys)
    assert code == 1
    assert failed(lines) == [f"MISSING   {TRAINING}  (required by {RUN / 'run.json'})"]


def test_a_run_deleted_with_its_receipt_is_missing_where_the_outcome_names_it(trained, capsys):
    """The outcome's receipt names the run's run.json: deleting the whole run folder with its
    training-records receipt still shows."""
    outcome = RECEIPTS / "outcome.json"
    write_receipt(outcome, "outcome", [subject(RUN / "run.json")], {})
    shutil.rmtree(RUN)
    TRAINING.unlink()
    code, lines = run_verify(capsys)
    assert code == 1
    assert f"MISSING   {TRAINING}  (required by {RUN / 'run.json'})" in lines
    assert f"MISSING   {RUN / 'run.json'}  (subject of {outcome})" in lines


def test_an_unfinished_run_needs_no_receipt(trained, capsys):
    """A run folder without run.json is still training (or died): no receipt is due yet."""
    (trained / RUN / "run.json").unlink()
    TRAINING.unlink()
    code, lines = run_verify(capsys)
    assert code == 0, failed(lines)


def test_a_freeze_from_before_run_receipts_requires_none(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    freeze_experiment(tmp_path, run_receipts=False)
    train(tmp_path)
    TRAINING.unlink()
    capsys.readouterr()
    code, lines = run_verify(capsys)
    assert code == 0, failed(lines)


def test_a_trajectory_edited_after_training_is_named(trained, capsys):
    path = trained / RUN / "trajectories.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = lines[2].replace('"reward": 0', '"reward": 1')  # one failure turned into a success
    path.write_text("\n".join(lines) + "\n")
    code, out = run_verify(capsys)
    assert code == 1
    assert failed(out) == [f"MISMATCH  {RUN / 'trajectories.jsonl'}  (subject of {TRAINING})"]


def test_a_training_receipt_rewritten_after_an_edit_fails_its_signature(
    tmp_path, monkeypatch, capsys
):
    keys = tmp_path / "keys"
    keys.mkdir()
    assert signing.main(["keygen", "--private", str(keys / "k"), "--public", str(keys / "p")]) == 0
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.chdir(run)
    monkeypatch.setenv(signing.KEY_ENV, str(keys / "k"))
    freeze_experiment(run)
    train(run)
    monkeypatch.delenv(signing.KEY_ENV)
    path = run / RUN / "trajectories.jsonl"
    path.write_text(path.read_text().replace('"reward": 0', '"reward": 1'))
    statement = json.loads(TRAINING.read_text())
    statement["subject"] = [subject(RUN / name) for name in RECORDS]  # digests recomputed
    statement["predicate"]["statement_sha256"] = statement_digest(statement)
    TRAINING.write_text(json.dumps(statement))
    capsys.readouterr()
    assert run_verify(capsys)[0] == 0  # the digests alone cannot tell
    code, lines = run_verify(capsys, "--public-key", str(keys / "p"))
    assert code == 1
    assert failed(lines) == [f"NOT THIS RECEIPT {TRAINING}{signing.SUFFIX}  (its signature)"]
