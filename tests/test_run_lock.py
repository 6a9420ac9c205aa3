"""One trainer per run: the journal's lock refuses a second trainer on the same run in one line
naming the holder, and the kernel frees it when the holder dies, however it dies."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from envab.trainer.resume import LOCK, RunHeld, held

HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from envab.trainer.resume import held
    with held(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(300)
    """
)


def test_a_second_hold_on_a_run_is_refused_naming_the_first(tmp_path):
    with held(tmp_path) as lease:
        with (
            pytest.raises(RunHeld, match="another trainer holds this run") as refused,
            held(tmp_path),
        ):
            pass
        assert f'"pid": {lease["pid"]}' in str(refused.value)
    with held(tmp_path):  # released at the block's end
        pass
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == lease["pid"]


@pytest.mark.integration
def test_a_second_trainer_is_refused_and_a_killed_holder_frees_the_run(tmp_path):
    run = tmp_path / "results" / "exp" / "drums" / "seed1"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        paths = {name: str(run / name) for name in ("pins.json", "run.json")}
        trainer = [
            sys.executable, "-m", "envab.trainer.grpo", "--target", "t.yaml",
            "--receipts", "r.json", "--pins", paths["pins.json"], "--model", "m",
            "--train", "train.jsonl", "--trajectories", "x", "--checkpoint-records", "x",
            "--checkpoints", "x", "--run", paths["run.json"], "--steps", "x", "--wandb-dir", "x",
        ]  # fmt: skip
        second = subprocess.run(trainer, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr[-2000:]
        (line,) = second.stderr.strip().splitlines()[-1:]
        assert "another trainer holds this run" in line and f'"pid": {holder.pid}' in line
        assert not (run / "journal").exists()  # refused before it touched the run
    finally:
        holder.kill()  # as an out-of-memory kill would
        holder.wait()
    with held(run):  # the kernel let go of the dead holder's lock
        pass
