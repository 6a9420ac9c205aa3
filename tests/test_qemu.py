"""The QEMU warm-snapshot arm against real QEMU (TCG on machines without hardware KVM).

One cached guest image and one VM for the whole module. Cold (no image under build/qemu, or
ENVAB_QEMU_CACHE): the guest is built first, a few minutes and root needed. Warm: about a minute.
The tests of pure parts (acceleration choice, coordinates, keys, missing tools) need no QEMU.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envs.desktop.actions import TYPABLE
from envs.protocol import ForkUnsupported, Gate, Verdict
from envs.qemu.accel import detect
from envs.qemu.inputs import ABS_SPAN, to_abs
from envs.qemu.keymap import CHAR_TO_QCODE, LINUX_TO_CHAR, LINUX_TO_PRESS, PRESS_KEYS, ROWS
from envs.qemu.tools import ToolMissing, require
from envs.tasks.build import build
from envs.tasks.local import LocalBackend

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
    with pytest.raises(ToolMissing, match="^debootstrap not found: install the Debian package "
                                          "debootstrap$"):
        require("debootstrap")
    result = subprocess.run(
        [sys.executable, "-m", "envs.qemu.image", "--cache", str(tmp_path / "cache")],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PATH": str(tmp_path)},
    )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "envs.qemu.image: qemu-system-x86_64 not found: install the Debian package "
        "qemu-system-x86"
    ]


# --- real QEMU -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    from envs.qemu.pool import QemuConfig, QemuPool

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
        # dirty it, so the next restore has something to undo
        dirty = vm.call("setup", timeout=20.0, config=tasks[i % len(tasks)]["config"])
        assert dirty["state_sha256"] != pool.guest.blank_state_sha256


@needs_qemu
def test_oracle_play_matches_the_in_process_desktop_state_and_pixels(pool, taskset):
    """Every family's oracle, step by step: same state hash and identical pixels as Desktop."""
    tasks, solutions = taskset
    local = LocalBackend()
    kinds = set()
    for task in tasks:
        with pool.create(task) as vm_session, local.create(task) as twin:
            assert vm_session.valid, vm_session.observation.failed_gates
            assert vm_session.observation.state_sha256 == twin.observation.state_sha256
            assert vm_session.observation.screenshot.tobytes() == \
                twin.observation.screenshot.tobytes()
            for action in solutions[task["id"]]["oracle"]:
                kinds.add(action["action_type"])
                got, want = vm_session.step(action), twin.step(action)
                assert got.valid, (task["id"], action, got.failed_gates)
                assert got.state_sha256 == want.state_sha256, (task["id"], action)
                assert got.screenshot.tobytes() == want.screenshot.tobytes(), (task["id"], action)
    assert {"CLICK", "TYPING"} <= kinds


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


@needs_qemu
def test_a_dead_vm_is_invalid_then_replaced(pool, taskset):
    tasks, solutions = taskset
    task = tasks[0]
    slot = pool.slots[0]
    launches = slot.launches
    with pool.create(task) as session:
        slot.vm.proc.kill()
        slot.vm.proc.wait()
        obs = session.step(solutions[task["id"]]["oracle"][0])
        assert obs.verdict == Verdict.ENV_FAILURE
        assert obs.failed_gates == (Gate.WORKER_ALIVE,)
        assert session.verify().score is None
    with pool.create(task) as session:
        assert session.valid
        assert slot.launches == launches + 1
