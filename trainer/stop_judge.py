"""The training side of stop at target (budget.stop_at_target): at each checkpoint, ask
analysis/stop_at_target.py, in a process of its own, whether the run's fate is decided.

The trainer hands that process paths (the held-out split among them, which it never opens) and
reads back one word: stop, with its reason, or go on. The ledger's clock is paused meanwhile, as
an evaluation job beside training would not have counted either (trainer/accounting.py). A judge
that fails is said on the console and counted, and the run goes on to its budget: the
workflow's own evaluation jobs then judge it as they would any run.
"""

from __future__ import annotations

import json
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
    settings: dict  # heldout, backend, confirm_backend, store, log
    judged: Path  # the judge's evaluations and verdicts, in the run's journal
    cores: int
    failures: int = 0
    verdicts: list[dict] = field(default_factory=list)

    def __call__(self, checkpoint: str) -> str | None:
        """The reason to stop after `checkpoint`, or None to go on."""
        out = self.judged / f"verdict-{checkpoint}.json"
        command = [
            sys.executable,
            "-m",
            "envab.analysis.stop_at_target",
            *self.frozen,
            "--checkpoint-records",
            str(self.checkpoint_records),
            "--checkpoints",
            str(self.checkpoints),
            "--heldout",
            self.settings["heldout"],
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
            code = subprocess.run(command, stdout=log, stderr=log, check=False).returncode
        if code or not out.is_file():
            self.failures += 1
            self.verdicts.append({"checkpoint": checkpoint, "decision": "failed", "exit": code})
            return None
        verdict = json.loads(out.read_text())
        self.verdicts.append(verdict)
        return verdict["stop_reason"] if verdict["decision"] == "stop" else None
