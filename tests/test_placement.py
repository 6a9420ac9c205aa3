"""training.cpus: the trainer on its CPUs, every child the arm starts on the environments'."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from envab.envs.placement import PlacementError, pin, unpinned

CPUS = sorted(os.sched_getaffinity(0))

# Run in a process of its own: pinning this test process would slow every test after it.
PROBE = """
import json, os, subprocess, sys, threading
from envab.envs.placement import pin
from envab.envs.lifetime import start_child
early = threading.Thread(target=threading.Event().wait, daemon=True)  # a thread already running
early.start()
placement = pin([{trainer}], [{environments}])
child = start_child([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                    stdout=subprocess.PIPE, text=True)
threads = {{int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}}
print(json.dumps({{"placement": placement, "child": json.loads(child.communicate()[0]),
                  "threads": sorted({{tuple(v) for v in threads.values()}})}}))
"""


@pytest.mark.skipif(len(CPUS) < 2, reason=f"pinning apart needs two CPUs; this job has {CPUS}")
def test_the_trainer_and_the_arms_children_run_apart():
    trainer, environments = CPUS[0], CPUS[1]
    code = PROBE.format(trainer=trainer, environments=environments)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["placement"] == {"trainer": [trainer], "environments": [environments]}
    assert seen["child"] == [environments]  # a VM or the embedded host
    assert seen["threads"] == [[trainer]]  # every thread of the trainer, the early one too


def test_cpus_the_job_cannot_use_or_shared_by_both_are_refused():
    try:
        with pytest.raises(PlacementError, match="not available"):
            pin([CPUS[0]], [max(CPUS) + 1])
        with pytest.raises(PlacementError, match="given to both"):
            pin([CPUS[0]], [CPUS[0]])
        assert sorted(os.sched_getaffinity(0)) == CPUS  # nothing was pinned
    finally:
        unpinned()
