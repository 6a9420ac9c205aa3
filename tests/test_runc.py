"""The OCI container kind of the host (envs/host/runc.py), against Debian's real runc: a probe
worker inside a container, each probe compared with the same probe outside, then the host in
restore mode playing a task with its oracle and refusing a fork. Needs runc and root; without
them each test skips with the reason."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import envab
from envab.envs.arms import open_arm
from envab.envs.host.runc import Runc, runc_problem
from envab.envs.protocol import ForkUnsupported
from envab.envs.tasks.build import build

needs_runc = pytest.mark.skipif(runc_problem() is not None, reason=f"runc: {runc_problem()}")

# A worker that greets its host, then answers one probe and exits (the standard library only).
PROBE = r"""
import errno, json, os, socket, sys
from envab.envs.channel import PipeChannel

def attempt(f):
    try:
        return f()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

def probe(port, host_pid, secrets):
    status = dict(
        line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line
    )
    return {
        "connect": attempt(lambda: socket.create_connection(("127.0.0.1", port), 2) and "ok"),
        "host_pid_seen": os.path.exists(f"/proc/{host_pid}"),
        "secrets": [attempt(lambda p=p: open(p).read() and "read") for p in secrets],
        "capabilities": status["CapEff"].strip(),
        "bounding": status["CapBnd"].strip(),
    }

if sys.argv[1:] == ["out"]:
    print(json.dumps(probe(*json.loads(sys.stdin.read()))))
    sys.exit(0)
ch = PipeChannel(0, 1)
sys.stdout = sys.stderr
ch.send({"pid": os.getpid()})
op, *args = ch.recv()
found = probe(*args)
found["write_usr"] = attempt(lambda: open("/usr/envab-probe", "w") and "ok")
ch.send(found)
"""


@needs_runc
def test_a_container_has_no_network_no_host_pids_no_host_files_and_no_capabilities(tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    readme = Path(envab.__file__).resolve().parents[1] / "README.md"
    args = [port, os.getpid(), [str(token), "/etc/shadow", str(readme)]]
    containers = Runc(tmp_path / "runc", [sys.executable, "-c", PROBE], timeout_s=60)
    try:
        control = subprocess.run(
            [sys.executable, "-c", PROBE, "out"],
            input=json.dumps(args),
            capture_output=True,
            text=True,
            check=True,
        )
        outside = json.loads(control.stdout)
        container, hello = containers.run()
        assert hello["pid"] == 1  # the worker is the container's init
        inside = container.channel.call(("probe", *args), timeout=30)
    finally:
        containers.close()
        listener.close()
    assert (outside["connect"], outside["host_pid_seen"]) == ("ok", True)  # the control
    assert outside["secrets"] == ["read"] * 3 and outside["capabilities"] != "0000000000000000"
    assert inside == {
        "connect": "ECONNREFUSED",  # its loopback is its own
        "host_pid_seen": False,
        "secrets": ["ENOENT"] * 3,  # the root holds /usr, Python and this package
        "capabilities": "0000000000000000",
        "bounding": "0000000000000000",
        "write_usr": "EROFS",
    }


@needs_runc
def test_the_host_on_runc_plays_a_task_with_its_oracle_and_refuses_a_fork():
    tasks, solutions = build(seed=1, per_family=1)
    task = next(t for t in tasks if t["id"] == "click_button-s1-000")
    oracle = next(s for s in solutions if s["id"] == task["id"])["oracle"]
    arm = {"backend": "drums", "url": "embedded", "mode": "restore", "sandbox": "runc"}
    with open_arm(arm) as backend:
        assert not backend.can_fork
        sessions = [backend.create(task) for _ in range(2)]
        with pytest.raises(ForkUnsupported):
            sessions[0].fork(2)
        for session in sessions:
            for action in oracle:
                session.step(action)
            verification = session.verify()
            assert (verification.valid, verification.score) == (True, 1.0)
            assert verification.audit["sandbox"]["runtime"] == "runc"
            session.close()
