"""The QEMU warm-snapshot arm against real QEMU (TCG on machines without hardware KVM).

One cached guest image and one VM for the whole module. Cold (no guest under build/qemu, or
under ENVAB_QEMU_CACHE): the guest is built first, about 4-5 minutes on a 2-core machine with
its downloads, and it needs root, debootstrap and the network. Warm (cached): 40-60 s under TCG.
The tests of pure parts (acceleration choice, coordinates, keys, missing tools) need no QEMU.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import ordinary_user
import pytest

from envab.envs.desktop.actions import TYPABLE
from envab.envs.protocol import ForkUnsupported, Gate, Verdict
from envab.envs.qemu import inputs as qemu_inputs
from envab.envs.qemu.accel import detect
from envab.envs.qemu.inputs import ABS_SPAN, to_abs
from envab.envs.qemu.keymap import CHAR_TO_QCODE, LINUX_TO_CHAR, LINUX_TO_PRESS, PRESS_KEYS, ROWS
from envab.envs.qemu.tools import ToolMissing, require
from envab.envs.tasks.build import build
from envab.envs.tasks.local import LocalBackend
from envab.hashing import sha256_bytes

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("ENVAB_QEMU_CACHE", REPO / "build/qemu"))
needs_qemu = pytest.mark.skipif(
    shutil.which("qemu-system-x86_64") is None,
    reason="qemu-system-x86_64 is not installed (Debian package qemu-system-x86)",
)


# --- no QEMU needed --------------------------------------------------------------------------


def test_acceleration_is_kvm_only_with_hardware_flags_and_a_working_dev_kvm():
    assert detect("flags\t: fpu vmx sse2\n", kvm_ok=True).mode == "kvm"
    assert detect("flags\t: fpu svm\n", kvm_ok=True).mode == "kvm"
    nested = detect("flags\t: fpu sse2 hypervisor\n", kvm_ok=True)
    assert nested.mode == "tcg" and "not hardware KVM" in nested.reason
    assert detect("flags\t: fpu vmx\n", kvm_ok=False).mode == "tcg"


@pytest.mark.parametrize("width", [128, 640, 1024])
def test_every_pixel_survives_the_tablet_axis(width):
    # The guest maps an absolute value v to pixel v * width // 0x8000.
    assert [to_abs(x, width) * width // ABS_SPAN for x in range(width)] == list(range(width))


def test_every_typable_character_round_trips_through_the_keyboard_table():
    linux_of_qcode = {q: k for _, q, k, _ in ROWS}
    for char in TYPABLE:
        qcode, shift = CHAR_TO_QCODE[char]
        assert LINUX_TO_CHAR[(linux_of_qcode[qcode], shift)] == char
    assert {LINUX_TO_PRESS[k] for _, k in PRESS_KEYS.values()} == set(PRESS_KEYS)


def test_a_missing_tool_is_one_line_naming_its_debian_package(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        ToolMissing, match="^debootstrap not found: install the Debian package debootstrap$"
    ):
        require("debootstrap")
    result = subprocess.run(
        [sys.executable, "-m", "envab.envs.qemu.image", "--cache", str(tmp_path / "cache")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(tmp_path)},
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "envab.envs.qemu.image: qemu-system-x86_64 not found: install the Debian package "
        "qemu-system-x86"
    ]


@needs_qemu
def test_a_build_without_debootstrap_stops_with_one_line_naming_it(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("qemu-system-x86_64", "qemu-img"):
        (tools / tool).symlink_to(shutil.which(tool))
    result = subprocess.run(
        [sys.executable, "-m", "envab.envs.qemu.image", "--cache", str(tmp_path / "cache")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": str(tools)},
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "envab.envs.qemu.image: debootstrap not found: install the Debian package debootstrap"
    )
    assert not list((tmp_path / "cache").glob("images/*/root.qcow2"))


# --- real QEMU -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    from envab.envs.qemu.pool import QemuConfig, QemuPool

    with QemuPool(QemuConfig(vms=1, cache=CACHE, step_timeout_s=20.0)) as backend:
        yield backend


@pytest.fixture(scope="module")
def taskset():
    tasks, solutions = build(seed=1, per_family=1)
    return tasks, {s["id"]: s for s in solutions}


@needs_qemu
def test_twenty_restores_each_give_back_the_saved_desktop(pool, taskset):
    tasks, _ = taskset
    vm = pool.slots[0].vm
    for i in range(20):
        vm.loadvm("warm")
        hello = vm.call("hello", timeout=20.0)
        assert hello["state_sha256"] == pool.guest.blank_state_sha256, f"restore {i}"
        screen = vm.screendump().crop((0, 0, *hello["screen"])).convert("RGB")
        assert sha256_bytes(screen.tobytes()) == pool.guest.blank_frame_sha256, f"restore {i}"
        # dirty it, so the next restore has something to undo
        dirty = vm.call("setup", timeout=20.0, config=tasks[i % len(tasks)]["config"])
        assert dirty["state_sha256"] != pool.guest.blank_state_sha256


@needs_qemu
def test_the_qemu_process_runs_under_its_seccomp_filter(pool):
    """QEMU runs the guest's code: a device-emulation escape must land in a process that cannot
    start programs or raise its privileges (envs/qemu/vm.py HOST_SANDBOX)."""
    status = Path(f"/proc/{pool.slots[0].vm.proc.pid}/status").read_text()
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["Seccomp"].strip() == "2", "QEMU runs without a seccomp filter"
    assert fields["NoNewPrivs"].strip() == "1"


def guest_shell(vm, line: str, timeout: float = 20.0) -> str:
    """Run `line` in the guest through qemu-guest-agent's guest-exec; its stdout."""
    agent = vm.guest_agent

    def ask(command: str, **arguments) -> dict:
        agent.send({"execute": command, "arguments": arguments})
        reply = agent.receive(
            lambda r: "return" in r or "error" in r, time.monotonic() + timeout, command
        )
        assert "error" not in reply, reply
        return reply["return"]

    pid = ask("guest-exec", path="/bin/sh", arg=["-c", line], **{"capture-output": True})["pid"]
    deadline = time.monotonic() + timeout
    while not (status := ask("guest-exec-status", pid=pid))["exited"]:
        assert time.monotonic() < deadline, f"{line!r} still running after {timeout} s"
        time.sleep(0.1)
    return base64.b64decode(status.get("out-data", "")).decode()


@needs_qemu
def test_a_restore_turns_the_guest_clock_back_and_services_have_no_watchdog(pool):
    """Under TCG a guest timed by the TSC saw its clock run on across restores, so an aged VM's
    guest saw minutes pass at once and did ever more catch-up work after each restore (journald
    killed by its watchdog and restarted every time): envs/qemu/vm.py's TCG_CLOCK_ARGS."""
    vm = pool.slots[0].vm

    def uptime_after_restore() -> float:
        vm.loadvm("warm")
        vm.guest_sync(timeout=20.0)
        return float(guest_shell(vm, "cat /proc/uptime").split()[0])

    first = uptime_after_restore()
    time.sleep(4.0)  # the VM runs on; without the fix the next restore's guest sees these 4 s
    assert abs(uptime_after_restore() - first) < 2.0
    shown = guest_shell(vm, "systemctl show --property=ServiceWatchdogs")
    assert shown.strip() == "ServiceWatchdogs=no"


def twin_episodes(tasks, solutions):
    """Every oracle, the near misses with the rarer actions, and a field typed with shift and
    punctuation: (task, actions) pairs that cover every computer_13 kind the desktop has."""
    rare = {"DOUBLE_CLICK", "PRESS", "SCROLL"}
    for task in tasks:
        sol = solutions[task["id"]]
        yield task, sol["oracle"]
        for miss in sol["near_misses"]:
            if rare & {a["action_type"] for a in miss["actions"]}:
                yield task, miss["actions"]
    task = next(t for t in tasks if t["id"].startswith("type_field"))
    click = solutions[task["id"]]["oracle"][0]
    yield (
        task,
        [
            click,
            {"action_type": "TYPING", "parameters": {"text": "aZ9 ,.-!?_~"}},
            {"action_type": "PRESS", "parameters": {"key": "backspace"}},
            {"action_type": "DONE", "parameters": {}},
        ],
    )


@needs_qemu
def test_play_matches_the_in_process_desktop_state_and_pixels(pool, taskset):
    """Step by step, the VM's state hash and screendump equal an in-process Desktop's."""
    tasks, solutions = taskset
    local = LocalBackend()
    kinds = set()
    for task, actions in twin_episodes(tasks, solutions):
        with pool.create(task) as vm_session, local.create(task) as twin:
            assert vm_session.valid, vm_session.observation.failed_gates
            assert vm_session.observation.state_sha256 == twin.observation.state_sha256
            assert (
                vm_session.observation.screenshot.tobytes() == twin.observation.screenshot.tobytes()
            )
            for action in actions:
                kinds.add(action["action_type"])
                got, want = vm_session.step(action), twin.step(action)
                assert got.valid, (task["id"], action, got.failed_gates)
                assert got.state_sha256 == want.state_sha256, (task["id"], action)
                assert got.screenshot.tobytes() == want.screenshot.tobytes(), (task["id"], action)
    assert kinds == {"CLICK", "DOUBLE_CLICK", "TYPING", "PRESS", "SCROLL", "DONE"}


@needs_qemu
def test_oracle_scores_one_and_near_miss_scores_zero(pool, taskset):
    tasks, solutions = taskset
    for task in tasks:
        sol = solutions[task["id"]]
        for actions, expected in ((sol["oracle"], 1.0), (sol["near_misses"][0]["actions"], 0.0)):
            with pool.create(task) as session:
                for action in actions:
                    session.step(action)
                result = session.verify()
            assert result.valid and result.score == expected, (task["id"], expected, result)
            assert result.audit["accel"] == pool.guest.accel


@needs_qemu
def test_gates_make_attempts_invalid_and_the_vm_serves_the_next_one(pool, taskset):
    tasks, solutions = taskset
    task = tasks[0]
    wrong = {**task, "evaluator": {**task["evaluator"], "initial_state_sha256": "0" * 64}}
    with pool.create(wrong) as session:
        assert not session.valid
        assert session.observation.verdict == Verdict.STATE_MISMATCH
        assert session.verify().score is None
    with pool.create(task) as session:
        assert session.valid
        with pytest.raises(ForkUnsupported):
            session.fork(2)
        with pytest.raises(ValueError, match="outside"):
            session.step({"action_type": "CLICK", "parameters": {"x": 500, "y": 5}})
        obs = session.step(solutions[task["id"]]["oracle"][0], generation=0)
        assert obs.valid and obs.generation == 1
        stale = session.step(solutions[task["id"]]["oracle"][0], generation=0)
        assert stale.verdict == Verdict.STALE_GENERATION
        assert session.verify().failed_gates == (Gate.GENERATION,)
    with pool.create(task) as session:
        assert session.step({"action_type": "DONE", "parameters": {}}).done
        with pytest.raises(ValueError, match="already ended"):
            session.step(solutions[task["id"]]["oracle"][0])
        assert session.generation == 1 and session.verify().valid


@needs_qemu
def test_input_the_guest_reads_differently_makes_the_episode_invalid(pool, taskset, monkeypatch):

    tasks, solutions = taskset
    task = next(t for t in tasks if t["id"].startswith("click_button"))
    true_abs = qemu_inputs.to_abs
    monkeypatch.setattr(qemu_inputs, "to_abs", lambda px, span: true_abs(px + 1, span))
    with pool.create(task) as session:
        obs = session.step(solutions[task["id"]]["oracle"][0])
        assert obs.failed_gates == (Gate.WORKER_ALIVE,)
        result = session.verify()
        assert result.score is None and "the guest read" in result.audit["failure"]


# fault switch -> the verdict and gate it must give, and whether the VM is replaced after it.
QEMU_FAULTS = {
    "kill": ({"kill_at_step": 1}, Verdict.ENV_FAILURE, Gate.WORKER_ALIVE, True),
    "stall": ({"stall_at_step": 1}, Verdict.TIMEOUT, Gate.STEP_TIMEOUT, True),
    "blank": ({"blank_at_step": 1}, Verdict.BLANK_SCREEN, Gate.SCREEN_NOT_BLANK, False),
    "stale": ({"stale_at_step": 1}, Verdict.STALE_GENERATION, Gate.SCREEN_CURRENT, False),
    "unknown_gate": ({"unknown_gate_at_step": 1}, Verdict.ENV_FAILURE, "display_compositor", False),
    "corrupt": ({"corrupt_restore": True}, Verdict.STATE_MISMATCH, Gate.STATE_HASH, False),
    "verifier": ({"verifier_unavailable": True}, Verdict.VERIFIER_UNAVAILABLE,
                 Gate.VERIFIER_AVAILABLE, False),
}  # fmt: skip


@needs_qemu
@pytest.mark.parametrize("fault", QEMU_FAULTS)
def test_each_fault_switch_gives_its_gate_and_the_vm_serves_the_next_one(
    pool, taskset, monkeypatch, fault
):
    """The switches training injects on the QEMU arm act on the real VM (a killed or stopped
    QEMU, a dirtied desktop) or on what its display gave; the next session is served as usual."""
    switches, verdict, gate, replaced = QEMU_FAULTS[fault]
    tasks, solutions = taskset
    task = next(t for t in tasks if t["id"].startswith("click_button"))
    # A stalled VM gives up after 2 s; a wrong screen after screen_wait_s (1 s), well before.
    monkeypatch.setattr(pool, "config", replace(pool.config, step_timeout_s=2.0, screen_wait_s=1.0))
    monkeypatch.setattr(pool, "allow_faults", True)
    slot = pool.slots[0]
    t0 = time.monotonic()
    with pool.create(task, faults=switches) as session:
        launches = slot.launches  # after a VM the test before broke was replaced
        obs = session.observation
        if obs.valid:
            obs = session.step(solutions[task["id"]]["oracle"][0])
        if gate != Gate.VERIFIER_AVAILABLE:
            assert (obs.valid, obs.verdict, obs.failed_gates, obs.screenshot) == (
                False,
                verdict,
                (gate,),
                None,
            )
        v = session.verify()
        assert (v.valid, v.score, v.verdict, v.failed_gates) == (False, None, verdict, (gate,))
    assert time.monotonic() - t0 < 10.0
    with pool.create(task) as session:
        assert session.valid and session.step(solutions[task["id"]]["oracle"][0]).valid
        assert session.verify().score == 1.0
    assert slot.launches == launches + replaced


@needs_qemu
def test_fault_switches_are_off_unless_asked_for_and_a_host_restart_is_refused(pool, taskset):
    tasks, _ = taskset
    with pytest.raises(ValueError, match="fault injection is off"):
        pool.create(tasks[0], faults={"kill_at_step": 1})
    pool.allow_faults = True
    try:
        with pytest.raises(ValueError, match="kill of the trainer"):
            pool.create(tasks[0], faults={"restart_host_at_step": 1})
    finally:
        pool.allow_faults = False


@needs_qemu
def test_sessions_open_at_once_get_a_vm_each_up_to_max_vms(pool, taskset, monkeypatch):
    """Last in the module: it starts a second VM. TRL opens a whole generation batch at once."""
    tasks, _ = taskset
    monkeypatch.setattr(pool, "config", replace(pool.config, max_vms=2, vm_wait_s=0.5))
    with pool.create(tasks[0]) as first, pool.create(tasks[1]) as second:
        assert first.valid and second.valid
        assert first.vm_name != second.vm_name
        assert second.observation.state_sha256 == tasks[1]["evaluator"]["initial_state_sha256"]
        with pytest.raises(RuntimeError, match="raise max_vms"):
            pool.create(tasks[2])
    assert len(pool.slots) == 2


def _running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie no one has reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@needs_qemu
def test_a_killed_job_takes_its_vms_with_it():
    """kill -9 of the process that holds a QEMU pool: its VMs go with it. They were started by
    the pool's launcher threads, which end long before the job does, so the parent-death signal
    is armed on one thread that lives as long as the process (envs/lifetime.py)."""
    script = (
        "import time\n"
        "from pathlib import Path\n"
        "from envab.envs.qemu.pool import QemuConfig, QemuPool\n"
        f"pool = QemuPool(QemuConfig(vms=2, cache=Path({str(CACHE)!r})))\n"
        "print(' '.join(str(s.vm.proc.pid) for s in pool.slots), flush=True)\n"
        "time.sleep(600)\n"
    )
    job = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in job.stdout.readline().split()]
        assert len(pids) == 2
        time.sleep(1.0)  # the launcher threads have ended by now; the VMs must still run
        assert all(_running(p) for p in pids)
    finally:
        job.kill()
        job.wait()
    deadline = time.monotonic() + 15
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(p) for p in pids), "a VM outlived the job that started it"


# --- as an ordinary user ---------------------------------------------------------------------

# One episode with the oracle, on a pool over a cache that root built.
ORACLE_EPISODE = """
import sys
from pathlib import Path
from envab.envs.qemu.pool import QemuConfig, QemuPool
from envab.envs.tasks.build import build
tasks, solutions = build(seed=1, per_family=1)
task = tasks[0]
oracle = next(s["oracle"] for s in solutions if s["id"] == task["id"])
with QemuPool(QemuConfig(vms=1, cache=Path(sys.argv[1]), step_timeout_s=20.0)) as pool:
    with pool.create(task) as session:
        for action in oracle:
            session.step(action)
        result = session.verify()
print(result.valid, result.score, result.audit["accel"])
"""

as_user = pytest.mark.skipif(
    ordinary_user.why_not_here() is not None, reason=str(ordinary_user.why_not_here())
)


@needs_qemu
@as_user
def test_an_ordinary_user_plays_on_the_guest_root_built(pool):
    """Root built the guest (the module's pool); a user who is not root runs QEMU on it, the
    cache's records readable, its files untouched."""
    home = ordinary_user.own(Path(tempfile.mkdtemp(prefix="envab-user-")))
    try:
        before = {p: p.stat().st_mtime_ns for p in CACHE.rglob("*") if p.is_file()}
        done = ordinary_user.run(
            [sys.executable, "-c", ORACLE_EPISODE, str(CACHE.resolve())],
            home=home, cwd=REPO, timeout=600, reads=[CACHE.resolve()],
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split() == ["True", "1.0", pool.guest.accel]
        after = {p: p.stat().st_mtime_ns for p in CACHE.rglob("*") if p.is_file()}
        assert after == before  # nothing of root's cache written by the user's run
    finally:
        shutil.rmtree(home, ignore_errors=True)


@needs_qemu
@as_user
def test_an_ordinary_user_without_the_guest_is_told_to_build_it_once_as_root():
    home = Path(tempfile.mkdtemp(prefix="envab-user-"))
    cache = home / "cache"
    cache.mkdir()
    ordinary_user.own(home)
    try:
        done = ordinary_user.run(
            [sys.executable, "-m", "envab.envs.qemu.image", "--cache", str(cache)],
            home=home, cwd=REPO, timeout=120,
        )  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        last = done.stderr.splitlines()[-1]
        assert "is not built under" in last and "debootstrap, which needs root" in last, last
        assert f"sudo .venv/bin/python -m envab.envs.qemu.image --cache {cache}" in last, last
        assert [p.name for p in cache.iterdir()] == [".lock"]  # nothing built, nothing begun
    finally:
        shutil.rmtree(home, ignore_errors=True)
