"""The namespace sandbox of the fork host (envs/host/namespaces.py), against real bubblewrap and
libseccomp: probes run inside a confined environment (a fork of a confined zygote, as the host
makes them) and each is compared with the same probe outside, so a probe that passes only
because the machine lacks the thing it looks for fails here; then the host itself: a fork group
that plays a task with its oracle, and a wedged environment killed from outside by its host pid.
Each test needs bwrap and libseccomp, and root or an ordinary user's user namespaces; without
them it skips with the reason. Run as root, the last test runs the others again as an ordinary
user (tests/ordinary_user.py)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import ordinary_user
import pytest

import envab
from envab.envs.arms import open_arm
from envab.envs.host import namespaces
from envab.envs.host.pool import HostConfig, Pool
from envab.envs.tasks.build import build

needs_namespaces = pytest.mark.skipif(
    namespaces.namespaces_problem() is not None,
    reason=f"namespace sandbox: {namespaces.namespaces_problem()}",
)

# The zygote's confinement, then one forked environment's, then the probes, in the environment.
# The standard library only, plus the module under test; one JSON line on stdout.
PROBE = r"""
import errno, json, os, resource, socket, sys

def attempt(f):
    try:
        return f()
    except MemoryError:
        return "MemoryError"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

def probe(port, host_pid, secrets, package):  # uses sys.argv[1]: "in" or "out"
    def fill():  # files of 32 MiB (one file may hold 64), until the tmpfs is full
        try:
            for i in range(64):
                with open(f"/tmp/fill{i}", "wb") as f:
                    f.write(bytes(32 * 2**20))
            return "never full"
        finally:
            for i in range(64):
                if os.path.exists(f"/tmp/fill{i}"):
                    os.remove(f"/tmp/fill{i}")

    status = dict(
        line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line
    )
    return {
        "connect": attempt(lambda: socket.create_connection(("127.0.0.1", port), 2) and "ok"),
        "interfaces": sorted(
            line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]
        ),
        "host_pid_seen": os.path.exists(f"/proc/{host_pid}"),
        "secrets": [attempt(lambda p=p: open(p).read() and "read") for p in secrets],
        "uid": [os.getuid(), os.getgid(), os.getgroups()],
        "capabilities": status["CapEff"].strip(),
        "no_new_privs": status["NoNewPrivs"].strip(),
        "seccomp": status["Seccomp"].strip(),
        # Another process: outside, the test's own (anyone may signal their own); inside, the
        # sandbox's init (the filter refuses kill whatever the target).
        "kill_other": attempt(lambda: os.kill(host_pid if sys.argv[1] == "out" else 1, 0) or "ok"),
        "cpu_s": resource.getrlimit(resource.RLIMIT_CPU)[0],
        # Only inside: outside, these would write the host's root, replace the probe, take
        # 3 GiB, fill /tmp.
        **({
            "write_usr": attempt(lambda: open("/usr/envab-probe", "w") and "ok"),
            "write_package": attempt(
                lambda: open(os.path.join(package, "envab-probe"), "w") and "ok"
            ),
            "write_tmp": attempt(lambda: open("/tmp/probe", "w").write("x") and "ok"),
            "exec": attempt(lambda: os.execv("/usr/bin/true", ["true"])),
            "memory_3gib": attempt(lambda: len(bytearray(3 * 2**30)) and "ok"),
            "file_65mib": attempt(lambda: open("/tmp/big", "wb").write(bytes(65 * 2**20)) and "ok"),
            "tmpfs": attempt(fill),
        } if sys.argv[1] == "in" else {}),
    }

where, port, host_pid, secrets, package = sys.argv[1:]
if where == "in":
    from envab.envs.host import namespaces
    namespaces.confine_zygote()
    read, write = os.pipe()
    if os.fork() == 0:  # one environment, as the zygote forks it
        namespaces.confine_environment()
        found = probe(int(port), int(host_pid), json.loads(secrets), package)
        os.write(write, json.dumps(found).encode())
        os._exit(0)
    os.close(write)
    print(os.read(read, 1 << 16).decode(), flush=True)
else:
    print(json.dumps(probe(int(port), int(host_pid), json.loads(secrets), package)), flush=True)
"""


def run_probe(inside: bool, port: int, secrets: list[str]) -> dict:
    package = str(Path(envab.__file__).resolve().parent)
    argv = [sys.executable, "-c", PROBE, "in" if inside else "out", str(port), str(os.getpid()),
            json.dumps(secrets), package]  # fmt: skip
    if inside:
        argv = namespaces.bwrap_argv(argv)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_namespaces
def test_a_confined_environment_has_no_network_no_host_pids_a_read_only_root_and_its_limits(
    tmp_path,
):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    # A token beside the run, the machine's accounts, this checkout's own README: none is there.
    readme = Path(envab.__file__).resolve().parents[1] / "README.md"
    secrets = [str(token), "/etc/passwd", str(readme)]  # each one readable outside, by anyone
    try:
        outside = run_probe(False, port, secrets)
        inside = run_probe(True, port, secrets)
    finally:
        listener.close()
    # Outside, as a plain process: each probe finds what it looks for (the control).
    assert outside["connect"] == "ok"
    assert outside["host_pid_seen"] is True
    assert outside["secrets"] == ["read"] * 3
    assert outside["seccomp"] == "0" and outside["kill_other"] == "ok"
    # Inside: nothing of it.
    assert inside["connect"] == "EPERM"  # sockets other than Unix ones are refused
    assert inside["interfaces"] == ["lo"]  # and the network namespace has only its own loopback
    assert inside["host_pid_seen"] is False
    assert inside["secrets"] == ["ENOENT"] * 3  # the root holds /usr, Python, this package
    assert (inside["write_usr"], inside["write_package"]) == ("EROFS", "EROFS")
    assert inside["write_tmp"] == "ok"  # its own tmpfs
    assert inside["uid"] == [65534, 65534, []]
    assert (inside["capabilities"], inside["no_new_privs"], inside["seccomp"]) == (
        "0000000000000000",
        "1",
        "2",
    )
    assert (inside["exec"], inside["kill_other"]) == ("EPERM", "EPERM")
    assert inside["memory_3gib"] == "MemoryError"  # the address-space limit, 2 GiB
    assert inside["cpu_s"] == namespaces.ENV_CPU_S
    assert inside["file_65mib"] == "EFBIG"  # one file: 64 MiB
    assert inside["tmpfs"] == "ENOSPC"  # the tmpfs: 256 MiB


def _task_and_oracle():
    tasks, solutions = build(seed=1, per_family=1)
    task = next(t for t in tasks if t["id"] == "click_button-s1-000")
    return task, next(s for s in solutions if s["id"] == task["id"])["oracle"]


def _status(pid: int) -> dict:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.split() for k, v in (line.split(":", 1) for line in lines if ":" in line)}


@needs_namespaces
def test_a_fork_group_in_the_namespace_sandbox_plays_its_task_with_the_oracle():
    task, oracle = _task_and_oracle()
    arm = {"backend": "drums", "url": "embedded", "mode": "fork", "sandbox": "namespaces"}
    with open_arm(arm) as backend:
        assert backend.can_fork
        parent = backend.create(task)
        children = parent.fork(8)
        parent.close()
        scores = []
        for child in children:
            assert child.observation.valid
            for action in oracle:
                child.step(action)
            verification = child.verify()
            assert verification.valid
            assert verification.audit["sandbox"]["runtime"] == "namespaces"
            assert verification.audit["sandbox"]["network"] == "none"
            scores.append(verification.score)
            child.close()
        assert scores == [1.0] * 8
        noop = backend.create(task)  # and the checker still tells a miss
        noop.step({"action_type": "DONE", "parameters": {}})
        assert noop.verify().score == 0.0
        noop.close()


@needs_namespaces
def test_the_host_sees_each_environment_confined_and_kills_a_wedged_one_by_its_host_pid():
    task, _ = _task_and_oracle()
    pool = Pool(HostConfig(mode="fork", sandbox="namespaces", allow_faults=True, step_timeout_s=2))
    pool.start()
    try:
        env = pool.create(task, {"stall_at_step": 1})
        assert env["valid"]
        inner = pool._envs[env["env_id"]].pid
        pid = namespaces.host_pid(pool._zygote_proc.pid, inner)
        assert pid is not None and pid != inner
        status = _status(pid)
        # Root's zygote dropped to nobody; an ordinary user's is the user to the host (nobody in
        # its user namespace).
        host_uid = namespaces.NOBODY if os.geteuid() == 0 else os.getuid()
        assert status["Uid"][:1] == [str(host_uid)] and status["Seccomp"] == ["2"]
        assert status["NSpid"][-1] == str(inner)  # a pid namespace of its own
        for ns in ("net", "pid", "mnt", "ipc", "uts"):  # none of the host's namespaces
            assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}")
        after = pool.step(
            env["env_id"], {"action_type": "CLICK", "parameters": {"x": 1, "y": 1}}, 0
        )
        assert (after["valid"], after["failed_gates"]) == (False, ["step_timeout"])
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and _status(pid)["State"][0] != "Z":
            assert time.monotonic() < deadline, "the wedged environment outlived its quarantine"
            time.sleep(0.05)
        assert pool.create(task)["valid"]  # the host and its sandbox go on
    finally:
        pool.stop()


@needs_namespaces
@pytest.mark.skipif(
    ordinary_user.why_not_here() is not None, reason=str(ordinary_user.why_not_here())
)
def test_an_ordinary_user_gets_the_same_sandbox_without_root(tmp_path):
    """The tests above again, as an ordinary user: bwrap makes a user namespace whose one id,
    nobody, is the user's own, and everything else holds as it does for root."""
    done = ordinary_user.pytest_as_user(__file__, "not ordinary_user")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    ran = re.search(r"(\d+) passed, 1 deselected in", out)  # all but this one, none skipped
    assert ran and int(ran.group(1)) >= 3 and "skipped" not in out, out[-2000:]


def test_a_kernel_that_forbids_user_namespaces_is_named_with_the_setting_that_allows_them(
    tmp_path,
):
    def kernel(**values):
        root = tmp_path / "-".join(f"{k}{v}" for k, v in values.items())
        for name, value in values.items():
            path = root.joinpath(*name.replace("__", ".").split("."))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{value}\n")
        return namespaces.user_namespaces_setting(root)

    debian = kernel(kernel__unprivileged_userns_clone=0, user__max_user_namespaces=15000)
    assert "kernel.unprivileged_userns_clone = 0" in debian
    assert "sysctl -w kernel.unprivileged_userns_clone=1" in debian
    assert "max_user_namespaces =" not in debian  # only what forbids them is named
    limited = kernel(user__max_user_namespaces=0)
    assert "sysctl -w user.max_user_namespaces=15000" in limited
    ubuntu = kernel(kernel__apparmor_restrict_unprivileged_userns=1, user__max_user_namespaces=9)
    assert "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in ubuntu
    # Nothing forbids them, yet bwrap failed: the settings to look at, and root.
    open_kernel = kernel(kernel__unprivileged_userns_clone=1, user__max_user_namespaces=9)
    assert "forbid" not in open_kernel and "or root" in open_kernel
