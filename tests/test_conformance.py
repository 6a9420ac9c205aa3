"""Every backend passes the one conformance check (envs/check.py): the embedded host with plain
process workers (fork and restore), its gVisor sandboxes, the QEMU pool, and the real X desktop
in gVisor and in QEMU. A backend that cannot run here is skipped with the reason."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from envab.envs.arms import open_arm
from envab.envs.check import FAULT_GATES, NonConformance, check_backend
from envab.envs.host.gvisor import gvisor_problem
from envab.envs.host.namespaces import namespaces_problem
from envab.envs.host.runc import runc_problem
from envab.envs.osworld.source import load_dir
from envab.envs.tasks.build import build

REPO = Path(__file__).resolve().parent.parent
XDESKTOP_TASKS = REPO / "envs" / "xdesktop" / "tasks"
XDESKTOP_TASK = "xd-terminal-write-file"  # st opens in seconds, under TCG too
QEMU_CACHE = os.environ.get("ENVAB_QEMU_CACHE", str(REPO / "build/qemu"))


def _no_qemu() -> str | None:
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 not found (setup installs it)"
    return None


def _no_gvisor() -> str | None:
    return f"gVisor sandbox: {gvisor_problem()}" if gvisor_problem() else None


def _no_namespaces() -> str | None:
    problem = namespaces_problem()
    return f"namespace sandbox: {problem}" if problem else None


def _no_runc() -> str | None:
    return f"runc: {runc_problem()}" if runc_problem() else None


def _no_xdesktop(sandbox_problem) -> str | None:
    if shutil.which("debootstrap") is None:
        return "debootstrap not found: the X desktop's root is built with it (setup installs it)"
    return sandbox_problem()


def _in_ci() -> str | None:
    """The X desktop in QEMU passes every check (7 min under TCG here), but its set-up gate
    failed on a second create in one of two runs on a loaded machine (a flake of the guest's
    terminal, docs/results/2026-12-03-fast-tier-and-main-job.md); until that is fixed it is not
    a CI gate: run it with CI unset."""
    if os.environ.get("CI") == "true":
        return "X desktop in QEMU: 7 min and a known set-up flake under load; run with CI unset"
    return None


def backend(name, arm, world, why_not=None, integration=True):
    marks = [pytest.mark.skipif(bool(why_not and why_not()), reason=str(why_not and why_not()))]
    if integration:
        marks.append(pytest.mark.integration)
    return pytest.param(arm, world, id=name, marks=marks)


BACKENDS = [
    backend(
        "process-fork",
        {"backend": "drums", "url": "embedded", "mode": "fork", "sandbox": "process"},
        "pillow",
        integration=False,
    ),
    backend(
        "process-restore",
        {"backend": "drums", "url": "embedded", "mode": "restore", "sandbox": "process"},
        "pillow",
        integration=False,
    ),
    backend(
        "gvisor-fork",
        {"backend": "drums", "url": "embedded", "mode": "fork", "sandbox": "gvisor"},
        "pillow",
        _no_gvisor,
    ),
    backend(
        "namespaces-fork",
        {"backend": "drums", "url": "embedded", "mode": "fork", "sandbox": "namespaces"},
        "pillow",
        _no_namespaces,
        integration=False,
    ),
    backend(
        "runc-restore",
        {"backend": "drums", "url": "embedded", "mode": "restore", "sandbox": "runc"},
        "pillow",
        _no_runc,
    ),
    backend("qemu", {"backend": "qemu", "vms": 1, "cache": QEMU_CACHE}, "pillow", _no_qemu),
    backend(
        "xdesktop-gvisor",
        {"backend": "drums", "url": "embedded", "mode": "fork", "world": "xdesktop"},
        "xdesktop",
        lambda: _no_xdesktop(_no_gvisor),
    ),
    backend(
        "xdesktop-qemu",
        {
            "backend": "drums",
            "url": "embedded",
            "mode": "restore",
            "world": "xdesktop",
            "sandbox": "qemu",
        },
        "xdesktop",
        lambda: _no_xdesktop(_no_qemu) or _in_ci(),
    ),
]


def task_and_oracle(world: str) -> tuple[dict, list[dict]]:
    if world == "pillow":
        tasks, solutions = build(seed=3, per_family=1, families=["click_button"])
        return tasks[0], solutions[0]["oracle"]
    tasks = {t.task["id"]: t.task for t in load_dir(XDESKTOP_TASKS).tasks}
    solutions = [
        json.loads(line) for line in (XDESKTOP_TASKS / "solutions.jsonl").read_text().splitlines()
    ]
    oracle = next(s["oracle"] for s in solutions if s["id"] == XDESKTOP_TASK)
    return tasks[XDESKTOP_TASK], oracle


@pytest.mark.parametrize(("arm", "world"), BACKENDS)
def test_the_backend_speaks_the_session_protocol(arm, world):
    task, oracle = task_and_oracle(world)
    with open_arm(arm, allow_faults=True) as opened:
        passed = check_backend(opened, task, oracle, faults=list(FAULT_GATES))
        can_fork = opened.can_fork
    # A corrupt start shows at create only against a state the task names (the Pillow factory's
    # tasks do; the X desktop's do not): there it is checked on a fork child, or not at all.
    corrupt = "fault corrupt_restore"
    if not task["evaluator"].get("initial_state_sha256"):
        corrupt += (
            " (on a fork child)"
            if can_fork
            else ": not checkable (the task names no initial state, no fork)"
        )
    assert passed == [
        "create",
        "step and verify",
        "refuse",
        "fork",
        "close",
        *(corrupt if name == "corrupt_restore" else f"fault {name}" for name in FAULT_GATES),
    ]


class AlwaysOne:
    """A backend whose verifier says 1 whatever the state: what the check must catch."""

    can_fork = False

    def __init__(self, backend):
        self.backend = backend

    def create(self, task, **kwargs):
        session = self.backend.create(task, **kwargs)
        real = session.verify
        session.verify = lambda: real().__class__(1.0, True, "valid")
        return session


def test_the_check_can_fail():
    task, oracle = task_and_oracle("pillow")
    arm = {"backend": "drums", "url": "embedded", "mode": "restore", "sandbox": "process"}
    with open_arm(arm) as opened, pytest.raises(NonConformance, match="verify no-op"):
        check_backend(AlwaysOne(opened), task, oracle)
