"""The training side of stop at target (budget.stop_at_target): at each checkpoint, ask
analysis/stop_at_target.py, in a process of its own, whether the run's fate is decided.

The trainer hands that process paths (the frozen receipts, from which the judge finds the
held-out split: no held-out path is ever in the trainer's arguments) and reads back one word:
stop, with its reason, or go on. The ledger's clock is paused meanwhile, as an evaluation job
beside training would not have counted either (trainer/accounting.py). A judge that fails, or
runs past its timeout (it is then killed with every process it started), is said on the console
and counted, and the run goes on to its budget: the workflow's own evaluation jobs then judge it
as they would any run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class StopJudge:
    """What the judge process is given: the frozen inputs as the trainer got them, the run's
    records and checkpoints, and the evaluation settings from the rule (rules/common.smk)."""

    frozen: list[str]  # --target, --receipts..., --pins
    checkpoint_records: Path
    checkpoints: Path
    settings: dict  # backend, confirm_backend, store, log: no held-out path (the judge finds it)
    # The judge's evaluations and verdicts: beside the evaluation store, outside the run's folder
    # and journal, which training reads and a resume rolls back; training opens only verdicts.
    judged: Path
    cores: int
    # Past this the judge is hung, not slow: killed, counted as a failure, and training goes on
    # (its clock paused meanwhile would otherwise stop the run with no time charged).
    timeout_s: float = 3600.0
    # the judge's program; its arguments follow (tests put a judge that fails or hangs here)
    program: tuple[str, ...] = (sys.executable, "-m", "envab.analysis.stop_at_target")
    failures: int = 0
    verdicts: list[dict] = field(default_factory=list)

    def __call__(self, checkpoint: str) -> str | None:
        """The reason to stop after `checkpoint`, or None to go on."""
        out = self.judged / f"verdict-{checkpoint}.json"
        command = [
            *self.program,
            *self.frozen,
            "--checkpoint-records",
            str(self.checkpoint_records),
            "--checkpoints",
            str(self.checkpoints),
            "--backend",
            json.dumps(self.settings["backend"], sort_keys=True),
            "--confirm-backend",
            json.dumps(self.settings["confirm_backend"], sort_keys=True),
            "--store",
            self.settings["store"],
            "--judged",
            str(self.judged),
            "--out",
            str(out),
            "--cores",
            str(self.cores),
        ]
        Path(self.settings["log"]).parent.mkdir(parents=True, exist_ok=True)
        with open(self.settings["log"], "a") as log:
            # its own session: a timeout ends the judge and every evaluation process it started
            judge = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
            try:
                code = judge.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(judge.pid, signal.SIGKILL)
                judge.wait()
                print(f"judge: timed out after {self.timeout_s:.0f} s at {checkpoint}", file=log)
                code = "timeout"
        if code or not out.is_file():
            self.failures += 1
            decision = "timeout" if code == "timeout" else "failed"
            self.verdicts.append({"checkpoint": checkpoint, "decision": decision, "exit": code})
            return None
        verdict = json.loads(out.read_text())
        self.verdicts.append(verdict)
        return verdict["stop_reason"] if verdict["decision"] == "stop" else None
