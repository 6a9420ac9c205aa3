"""The freeze stage run for real by Snakemake on the embedded default, then tampered with."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import SHIPPED_EXP as EXP

from envab.hashing import sha256_file
from envab.receipts import read_receipt

RECEIPTS = Path("receipts") / EXP
RESULTS = Path("results") / EXP


def verify(workflow):
    result = workflow.python("-m", "envab.verify", str(RECEIPTS))
    failed = [
        line
        for line in result.stdout.splitlines()
        if not line.startswith(("ok", "verify:", "DIFFERS"))  # DIFFERS is named, not failed
    ]
    return result.returncode, failed


def test_freeze_writes_every_receipt_and_verify_passes(frozen):
    for name in ("preregistration.json", "split.json", "code.json", "model.json"):
        assert (frozen.root / RECEIPTS / name).is_file(), name
    for arm in ("qemu", "drums"):
        pins = json.loads((frozen.root / RESULTS / arm / "seed1" / "pins.json").read_text())
        assert pins["arm"] == arm
    qemu, drums = (
        json.loads((frozen.root / RESULTS / arm / "seed1" / "pins.json").read_text())
        for arm in ("qemu", "drums")
    )
    assert qemu["comparable_sha256"] == drums["comparable_sha256"]
    code, failed = verify(frozen)
    assert (code, failed) == (0, [])
    result = frozen.snakemake("verify")
    assert result.returncode == 0, result.stderr[-2000:]


def test_snakemake_verify_checks_again_after_a_tamper_that_follows_a_first_verify(frozen):
    # The reviewer's command: a first verify passes; one byte flipped after it must fail the
    # second (a verify with a product of its own said "Nothing to be done" and exited 0).
    first = frozen.snakemake("verify")
    assert first.returncode == 0, first.stderr[-2000:]
    heldout = frozen.root / RESULTS / "tasks" / "heldout.jsonl"
    data = bytearray(heldout.read_bytes())
    data[len(data) // 2] ^= 0x01
    heldout.write_bytes(bytes(data))
    second = frozen.snakemake("verify")
    assert second.returncode != 0, second.stdout[-2000:] + second.stderr[-2000:]
    said = (second.stdout + second.stderr).split()
    assert said[said.index((RESULTS / "tasks" / "heldout.jsonl").as_posix()) - 1] == "MISMATCH"


def test_an_edit_to_the_analysis_after_the_freeze_is_named_by_verify_and_refused_by_the_next_run(
    frozen,
):
    # The judge that stops a run at its target decides the answer: frozen with the rest.
    judge = frozen.root / "analysis" / "stop_at_target.py"
    judge.write_text(judge.read_text().replace('"target_confirmed"', '"target_reached"', 1))
    code, failed = verify(frozen)
    assert code == 1 and failed == [
        line for line in failed if line.split()[:2] == ["MISMATCH", "analysis/stop_at_target.py"]
    ], failed
    result = frozen.snakemake("--dry-run")
    assert result.returncode != 0
    assert f"code changed since experiment '{EXP}' was frozen" in result.stderr
    assert "analysis/stop_at_target.py" in result.stderr


def test_a_later_freeze_at_other_code_names_what_differs_from_the_registered_code(frozen):
    # The first freeze registered the code in the anchor; a clone at a later commit (receipts and
    # results gone, the judge edited) freezes again and says which files differ.
    registered = json.loads(
        (frozen.root / "preregistration" / "anchors" / f"{EXP}.json").read_text()
    )
    assert "analysis/stop_at_target.py" in registered["code"]["files"]
    # what already differed (none where the anchor was written by this copy's first freeze)
    before = read_receipt(frozen.root / RECEIPTS / "code.json")["predicate"]
    before = set(before["differs_from_registered"])
    shutil.rmtree(frozen.root / "receipts")
    shutil.rmtree(frozen.root / "results")
    judge = frozen.root / "analysis" / "stop_at_target.py"
    judge.write_text(judge.read_text() + "\n# a later commit\n")
    result = frozen.snakemake("freeze")
    assert result.returncode == 0, result.stderr[-2000:]
    code = read_receipt(frozen.root / RECEIPTS / "code.json")["predicate"]
    assert code["differs_from_registered"] == sorted(before | {"analysis/stop_at_target.py"})
    verified = frozen.python("-m", "envab.verify", str(RECEIPTS))
    assert verified.returncode == 0, verified.stdout[-2000:]
    assert "DIFFERS   analysis/stop_at_target.py  (registered code of" in verified.stdout
    assert f"{len(before) + 1} pinned files differ from the registered code" in verified.stdout


def test_receipts_record_what_was_frozen(frozen):
    prereg = read_receipt(frozen.root / RECEIPTS / "preregistration.json")
    assert prereg["subject"][0]["name"] == "preregistration/target.yaml"
    split = read_receipt(frozen.root / RECEIPTS / "split.json")["predicate"]
    train = {t["id"] for t in split["train"]}
    heldout = {t["id"] for t in split["heldout"]}
    assert train and heldout and not train & heldout
    assert set(split["per_family"]["heldout"]) == set(split["per_family"]["train"])
    model = read_receipt(frozen.root / RECEIPTS / "model.json")
    assert {s["name"].rsplit("/", 1)[-1] for s in model["subject"]} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "chat_template.jinja",
    }
    code = read_receipt(frozen.root / RECEIPTS / "code.json")["predicate"]
    assert set(code["groups"]) == {"trainer", "reward", "envs", "eval", "analysis", "pipeline"}
    assert "analysis/stop_at_target.py" in code["groups"]["analysis"]["files"]
    assert "uncommitted" in code["source"]  # None here: the copy is not a git checkout
    for receipt in ("split.json", "code.json", "model.json"):
        depends = read_receipt(frozen.root / RECEIPTS / receipt)["predicate"]["depends_on"]
        assert [d["name"] for d in depends] == [(RECEIPTS / "preregistration.json").as_posix()]


def test_edited_target_is_refused_and_nothing_is_refrozen(frozen):
    receipt = frozen.root / RECEIPTS / "preregistration.json"
    before = receipt.read_bytes()
    frozen.edit_target(lambda t: t["target"].update(threshold=0.9))
    result = frozen.snakemake()
    assert result.returncode != 0
    assert f"was edited after experiment '{EXP}' was frozen" in result.stderr
    assert "new experiment_id" in result.stderr
    assert receipt.read_bytes() == before
    # A stage run outside Snakemake checks the frozen digest too.
    result = frozen.python(
        "-m",
        "envab.freeze",
        "code",
        "--target",
        "preregistration/target.yaml",
        "--receipts",
        (RECEIPTS / "preregistration.json").as_posix(),
        "--receipt",
        "code.json",
    )
    assert result.returncode == 2 and "was edited after" in result.stderr


def test_a_new_experiment_id_registers_afresh(frozen):
    frozen.edit_target(lambda t: t.update(experiment_id="embedded-default-next"))
    result = frozen.snakemake("--until", "freeze_target")
    assert result.returncode == 0, result.stderr[-2000:]
    assert (frozen.root / "receipts" / "embedded-default-next" / "preregistration.json").is_file()


def test_a_freeze_redone_with_another_target_is_refused_against_the_anchor(frozen):
    """The receipts deleted and the target edited under the same experiment id: the freeze job
    refuses, naming the committed anchor (preregistration/anchors/) and both digests, and
    nothing is frozen again."""
    anchor = frozen.root / "preregistration" / "anchors" / f"{EXP}.json"
    anchored = json.loads(anchor.read_text())["preregistration"]["digest"]["sha256"]
    frozen.edit_target(lambda t: t["target"].update(threshold=0.9))  # frozen: the anchor stays
    shutil.rmtree(frozen.root / RECEIPTS)
    result = frozen.snakemake("--until", "freeze_target")
    assert result.returncode != 0
    log = (frozen.root / "logs" / EXP / "freeze_target.log").read_text()
    now = sha256_file(frozen.root / "preregistration" / "target.yaml")
    assert anchored in log and now in log and "new experiment_id" in log, log
    assert not (frozen.root / RECEIPTS / "preregistration.json").exists()


@pytest.mark.parametrize(
    "path",
    [
        RESULTS / "model" / "model.safetensors",
        RESULTS / "tasks" / "heldout.jsonl",
        RECEIPTS / "split.json",
        RECEIPTS / "preregistration.json",
    ],
)
def test_one_flipped_byte_fails_verify_and_names_the_file(frozen, path):
    target = frozen.root / path
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    code, failed = verify(frozen)
    assert code == 1
    assert failed and all(line.split()[0] in ("MISMATCH", "MALFORMED") for line in failed)
    assert any(line.split()[1] == path.as_posix() for line in failed), failed
