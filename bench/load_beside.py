"""Run a command with a registered synthetic load beside it for its whole run, then stop the load.

    python bench/load_beside.py --workers 1 --load 50 --record load.json -- \
        .venv/bin/snakemake --cores all

The load is stress-ng's CPU workers where stress-ng is installed (`stress-ng --cpu W --cpu-load
P`: each worker busy P % of each period), else as many Python processes doing the same duty
cycle. It starts before the command and is stopped when the command ends, whatever its exit; the
record says what ran beside what, and for how long. What this stands in for: another user's job
on a shared machine or cluster node, steady for the whole run (the timing blocks' case to hold
under, docs/concepts/experiment.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

DUTY = """
import sys, time
busy = float(sys.argv[1]) / 100
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < 0.1 * busy:
        pass
    time.sleep(0.1 * (1 - busy))
"""


def start_load(workers: int, load: int) -> tuple[subprocess.Popen, str]:
    if shutil.which("stress-ng"):
        command = ["stress-ng", "--cpu", str(workers), "--cpu-load", str(load), "--quiet"]
        return subprocess.Popen(command, start_new_session=True), " ".join(command)
    # one session for every worker, so that one signal stops them all
    script = f"for i in $(seq {workers}); do {sys.executable} -c '{DUTY}' {load} & done; wait"
    return subprocess.Popen(["bash", "-c", script], start_new_session=True), (
        f"{workers} Python duty-cycle worker(s) at {load} %"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=1, help="CPU workers of the load")
    parser.add_argument("--load", type=int, default=50, help="each worker's busy percentage")
    parser.add_argument("--record", type=Path, help="writes what ran, beside what, how long")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    load, described = start_load(args.workers, args.load)
    started = time.monotonic()
    try:
        code = subprocess.run(command, check=False).returncode
    finally:
        os.killpg(load.pid, signal.SIGTERM)
        load.wait()
    wall = time.monotonic() - started
    record = {"command": command, "load": described, "exit": code, "wall_s": wall}
    print(f"load_beside: {described} beside `{' '.join(command)}`: exit {code}, {wall:.0f} s")
    if args.record:
        args.record.write_text(json.dumps(record, indent=2) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
