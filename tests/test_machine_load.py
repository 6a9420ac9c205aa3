"""The load a timed job records: CPU time of the job and its children, and the machine's share
of busy and stolen time, measured over a known piece of work."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

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


# Outside demand (what the timing blocks' load rule judges, trainer/timing.py): the time a thread
# outside the run spent running or waiting to run. A job that always wants a CPU asks for the
# whole window whichever arm runs beside it; what it *gets* depends on the arm.
SPIN_BY_WALL = (
    "import sys, time\n"
    "busy = float(sys.argv[1])\n"
    "end = time.monotonic() + 60  # gone within a minute should the test be killed first\n"
    "while time.monotonic() < end:\n"
    "    t = time.perf_counter()\n"
    "    while time.perf_counter() - t < 0.05 * busy: pass\n"
    "    time.sleep(0.05 * (1 - busy))\n"
)


def outside_process(code: str, *args: object) -> int:
    """A Python process running `code`, outside this process's tree (its shell parent exits):
    its pid. `code` ends by itself within a minute, should the test be killed before it."""
    line = " ".join([sys.executable, "-c", f"'{code}'", *map(str, args)])
    shell = subprocess.run(
        ["bash", "-c", f"{line} >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
    )
    return int(shell.stdout)


def outside_job(busy: float) -> int:
    """A duty-cycle worker, busy by the clock `busy` of each period, outside this tree."""
    return outside_process(SPIN_BY_WALL, busy)


def demand_of(pid: int, before: dict, after: dict) -> tuple[float, float]:
    """Seconds the worker's one thread wanted, and ran, between two scans."""
    ((thread, now),) = [(t, v) for t, v in after.items() if t[0] == pid]
    run0, wait0 = before[thread]
    return (now[0] - run0 + now[1] - wait0) / 1e9, (now[0] - run0) / 1e9


def window_beside(command: list[str], worker: int) -> dict:
    """Run `command` as a timed window's run is run: the worker's demand and CPU between the
    scans, the time from the end of the first scan to the start of the last (`inner`) and from
    the start of the first to the end of the last (`outer`), and whether a scan saw the run."""
    scanned = time.monotonic()
    before = load.outside_threads(os.getpid())
    started = time.monotonic()
    run = subprocess.Popen(command)
    seen = load.outside_threads(os.getpid())
    run.wait()
    ended = time.monotonic()
    after = load.outside_threads(os.getpid())
    wanted, ran = demand_of(worker, before, after)
    return {
        "wanted": wanted,
        "ran": ran,
        "inner": ended - started,
        "outer": time.monotonic() - scanned,
        "run_seen": run.pid in {t[0] for t in seen},
    }


def kernel_counts_waits() -> None:
    if load.outside_threads(1) is None:
        pytest.skip("this kernel keeps no per-thread wait (schedstat, sched_info)")


def busy_run() -> list[str]:
    """A run that keeps every core busy for 2 s."""
    spin = f"timeout 2 {sys.executable} -c 'while 1: pass'"
    return ["bash", "-c", f"for i in $(seq {os.cpu_count() or 1}); do {spin} & done; wait"]


def test_a_steady_outside_job_wants_the_same_whichever_run_is_beside_it():
    kernel_counts_waits()
    worker = outside_job(busy=1.0)
    try:
        time.sleep(0.2)
        for command in (busy_run(), ["sleep", "2"]):
            w = window_beside(command, worker)
            # always runnable: it asked for the whole window, beside a run that took every core
            # as beside one that slept (what it got is not asserted: the suite's other workers
            # share this machine)
            assert 0.9 * w["inner"] <= w["wanted"] <= w["outer"] + 0.05, (command, w)
            assert w["ran"] <= w["wanted"]
            assert not w["run_seen"], "the run's own process was scanned as outside"
    finally:
        os.kill(worker, 15)


def test_a_half_busy_outside_job_wants_half_the_window_beside_either_run():
    # the registered load's shape (bench/load_beside.py): busy by the clock half of each period.
    # Beside a run that takes every core it waits for a CPU after each wake-up, which adds a
    # little; what it obtains beside that run is what v17's rule judged, and far less.
    kernel_counts_waits()
    worker = outside_job(busy=0.5)
    try:
        time.sleep(0.2)
        share = {}
        for name, command in (("busy", busy_run()), ("idle", ["sleep", "2"])):
            w = window_beside(command, worker)
            share[name] = w["wanted"] / w["inner"]
        assert 0.35 <= share["idle"] <= 0.7, share
        assert abs(share["busy"] - share["idle"]) <= 0.15, share
    finally:
        os.kill(worker, 15)


def test_a_light_threads_wait_is_latency_the_run_caused_not_demand():
    # a kernel thread that waited 0.10 of a CPU beside a QEMU window, running 0.006 (v18's first
    # quiet timing job, a block refused for it), and the registered load's worker beside it
    span = 1.0
    light, worker = (5, 1), (6, 1)
    before = {light: (0, 0), worker: (0, 0)}
    after = {light: (6_000_000, 100_000_000), worker: (240_000_000, 280_000_000)}
    wanted, ran = load.outside_demand_s(before, after, span)
    assert ran == pytest.approx(0.246)
    assert wanted == pytest.approx(0.006 + 0.52)  # the light one's run, the worker's run + wait
    # at the bound a thread is CPU-bound: its wait counts
    at_bound = {light: (int(load.CPU_BOUND * 1e9), 100_000_000)}
    assert load.outside_demand_s({light: (0, 0)}, at_bound, span)[0] == pytest.approx(
        load.CPU_BOUND + 0.1
    )


LIGHT = (
    "import time\n"
    "end = time.monotonic() + 60\n"
    "while time.monotonic() < end:\n"
    "    time.sleep(0.002)\n"
)


def test_a_light_outside_thread_wants_the_same_beside_a_busy_run_as_beside_an_idle_one():
    kernel_counts_waits()
    light = outside_process(LIGHT)
    try:
        time.sleep(0.2)
        share = {}
        for name, command in (("busy", busy_run()), ("idle", ["sleep", "2"])):
            scanned = time.monotonic()
            before = load.outside_threads(os.getpid())
            subprocess.run(command, check=True)
            after = load.outside_threads(os.getpid())
            span = time.monotonic() - scanned
            mine = {t: v for t, v in after.items() if t[0] == light}
            wanted, ran = load.outside_demand_s(before, mine, span)
            assert ran < load.CPU_BOUND * span, (name, ran, span)  # light, as meant
            assert wanted == ran, (name, wanted, ran)  # its wait is not demand
            share[name] = wanted / span
        assert abs(share["busy"] - share["idle"]) < 0.03, share
    finally:
        os.kill(light, 15)
