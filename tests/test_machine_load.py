"""The load a timed job records: CPU time of the job and its children, and the machine's share
of busy and stolen time, measured over a known piece of work."""

from __future__ import annotations

import subprocess
import sys
import time

from envab import machine_load as load


def test_cpu_time_of_the_job_and_its_children_is_counted():
    start = load.Snapshot.now()
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    measured = load.since(start)
    assert 0.8 <= measured["cpu_s"] < 0.8 + measured["wall_s"] * measured["cores"]
    assert measured["cpu_hours"] == measured["cpu_s"] / 3600
    assert 0 < measured["cpu_utilisation"] <= 1.0
    assert len(measured["loadavg_1_5_15"]) == 3
    # Linux: the machine was at least as busy as this job kept one of its cores.
    assert measured["machine_busy_fraction"] >= 0.8 / (measured["wall_s"] * measured["cores"]) - 0.1
    assert 0 <= measured["steal_fraction"] <= 1
