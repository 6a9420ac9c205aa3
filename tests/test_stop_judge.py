"""The training side of stop at target (trainer/stop_judge.py) against judges that answer, fail
and hang: its only answer to training is the verdict; a failed or hung judge is counted and
training goes on; a hung judge is killed with every process it started."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from envab.trainer.stop_judge import StopJudge

# A judge stand-in reads the trainer's arguments as the real one does and writes --out.
ANSWERS = """
import json, sys
out = sys.argv[sys.argv.index("--out") + 1]
json.dump({"checkpoint": "ckpt-256", "decision": %r, "stop_reason": %r, "judged_s": 0.1},
          open(out, "w"))
"""
HANGS = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(sys.argv[sys.argv.index("--judged") + 1] + "/grandchild.pid", "w").write(str(child.pid))
time.sleep(300)
"""


def judge_with(tmp_path: Path, script: str, timeout_s: float = 60) -> StopJudge:
    judged = tmp_path / "judged"
    judged.mkdir()
    return StopJudge(
        frozen=["--target", "target.yaml", "--receipts", "r.json", "--pins", "pins.json"],
        checkpoint_records=tmp_path / "checkpoints.jsonl",
        checkpoints=tmp_path / "checkpoints",
        settings={
            "backend": {},
            "confirm_backend": {},
            "store": str(tmp_path / "store"),
            "log": str(tmp_path / "judge.log"),
        },
        judged=judged,
        cores=1,
        timeout_s=timeout_s,
        program=(sys.executable, "-c", script),
    )


@pytest.mark.parametrize(
    ("decision", "reason", "expected"),
    [("stop", "target_reached", "target_reached"), ("go_on", None, None)],
)
def test_the_verdict_is_the_judges_only_answer(tmp_path, decision, reason, expected):
    judge = judge_with(tmp_path, ANSWERS % (decision, reason))
    assert judge("ckpt-256") == expected
    assert judge.failures == 0
    assert judge.verdicts[-1]["decision"] == decision


def test_a_failing_judge_is_counted_and_training_goes_on(tmp_path):
    judge = judge_with(tmp_path, "import sys; sys.exit(3)")
    assert judge("ckpt-256") is None
    assert judge.failures == 1
    assert judge.verdicts[-1] == {"checkpoint": "ckpt-256", "decision": "failed", "exit": 3}


def test_a_hung_judge_is_killed_with_what_it_started_and_training_goes_on(tmp_path):
    judge = judge_with(tmp_path, HANGS, timeout_s=3)
    started = time.monotonic()
    assert judge("ckpt-256") is None
    assert time.monotonic() - started < 30
    assert judge.failures == 1
    assert judge.verdicts[-1]["decision"] == "timeout"
    assert "timed out after 3 s at ckpt-256" in (tmp_path / "judge.log").read_text()
    grandchild = int((tmp_path / "judged" / "grandchild.pid").read_text())
    for _ in range(50):  # the kill reaches the grandchild at once; its reaping may take a moment
        status = Path(f"/proc/{grandchild}/stat")
        if not status.exists() or status.read_text().split(")")[1].split()[0] == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the hung judge's child {grandchild} outlived it")


def test_a_judge_that_exits_0_without_a_verdict_is_a_failure(tmp_path):
    judge = judge_with(tmp_path, "pass")
    assert judge("ckpt-256") is None
    assert judge.failures == 1
    assert json.dumps(judge.verdicts[-1]) == json.dumps(
        {"checkpoint": "ckpt-256", "decision": "failed", "exit": 0}
    )
