"""The gVisor sandboxes of the fork host, against real runsc: isolation before and after a
restore, a fork that copies the sandbox's memory and then lets each copy go its own way, and a
sandbox killed from outside that is an invalid verdict, not a crash. The host's protocol on
gVisor (fork children in the parent's exact state, the fault matrix) is in test_host.py."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import envab
from envab.envs.arm_schema import ArmError
from envab.envs.arms import open_arm
from envab.envs.host.gvisor import Gvisor, SandboxUnavailable, gvisor_problem
from envab.envs.host.pool import HostConfig, Pool
from envab.envs.tasks.build import build

needs_gvisor = pytest.mark.skipif(
    gvisor_problem() is not None, reason=f"gVisor sandbox: {gvisor_problem()}"
)

# A worker that answers the host's greetings and probes its own sandbox.
PROBE = r"""
import errno, os, socket, sys, time
from envab.envs.channel import PipeChannel

def attempt(f):
    try:
        return f()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))

ch = PipeChannel(0, 1)
sys.stdout = sys.stderr
ch.send({"pid": os.getpid()})
while True:
    try:
        op, *args = ch.recv()
    except Exception:
        os._exit(0)
    if op == "hello":
        reply = {"pid": os.getpid(), "state_sha256": None}
    elif op == "probe":
        port, secrets = args
        reply = {
            "connect": attempt(lambda: socket.create_connection(("127.0.0.1", port), 2) and "ok"),
            "interfaces": sorted(name for _, name in socket.if_nameindex()),
            "secrets": [attempt(lambda p=p: open(p).read()) for p in secrets],
            "write_usr": attempt(lambda: open("/usr/envab-probe", "w") and "ok"),
        }
    elif op == "write":
        with open("/tmp/state", "w") as f:
            f.write(args[0])
        reply = {"ok": True}
    elif op == "read":
        reply = {"state": open("/tmp/state").read()}
    elif op == "fill":  # what an agent's `dd if=/dev/zero of=/tmp/fill` does
        written, errno_name = 0, None
        try:
            with open("/tmp/fill", "wb") as f:
                while True:
                    f.write(bytes(2**20))
                    f.flush()
                    written += 1
        except OSError as e:
            errno_name = errno.errorcode.get(e.errno, str(e.errno))
        reply = {"written_mib": written, "errno": errno_name}
    elif op == "bomb":  # what an agent's fork bomb does, bounded so that a test ends
        for _ in range(args[0]):
            if os.fork() == 0:
                time.sleep(120)
                os._exit(0)
        reply = {"forked": args[0]}
    elif op == "hog":  # what an agent's runaway allocation does
        hog = [bytearray(2**20) for _ in range(args[0])]
        reply = {"held_mib": len(hog)}
    ch.send(reply)
"""


@pytest.fixture
def sandboxes(tmp_path):
    gv = Gvisor(tmp_path / "gvisor", [sys.executable, "-c", PROBE], timeout_s=60)
    yield gv
    gv.close()


@needs_gvisor
def test_a_sandbox_has_no_network_and_no_host_files_before_and_after_a_restore(sandboxes, tmp_path):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    # A token beside the run, the machine's accounts, this checkout's own files: none is there.
    secrets = [
        str(token),
        "/etc/passwd",
        str(Path(envab.__file__).resolve().parents[1] / "README.md"),
    ]
    assert all(Path(p).exists() for p in secrets)
    assert socket.create_connection(("127.0.0.1", port), 2)  # the host itself can connect
    sandbox, hello = sandboxes.run()
    assert hello["pid"] == 1  # the worker is the sandbox's init, in its own pid namespace
    isolated = {
        "connect": "ECONNREFUSED",  # the sandbox's loopback is its own
        "interfaces": ["lo"],
        "secrets": ["ENOENT"] * 3,  # the root holds /usr, Python and this package, nothing else
        "write_usr": "EROFS",
    }
    assert sandbox.channel.call(("probe", port, secrets), timeout=30) == isolated
    image = sandboxes.checkpoint(sandbox, "probe")
    ((restored, _),) = sandboxes.restore(image, 1)
    assert restored.channel.call(("probe", port, secrets), timeout=30) == isolated
    listener.close()


@needs_gvisor
def test_a_fork_copies_the_sandbox_memory_then_each_copy_is_its_own(sandboxes):
    parent, _ = sandboxes.run()
    parent.channel.call(("write", "before the fork"), timeout=30)
    image, children = sandboxes.fork(parent, 3)
    assert parent.proc.wait(timeout=30) is not None  # the parent waits in the checkpoint
    for i, (child, _) in enumerate(children):
        assert child.channel.call(("read",), timeout=30) == {"state": "before the fork"}
        child.channel.call(("write", f"child {i}"), timeout=30)
    parent, _ = sandboxes.resume(image)  # used again: restored from the fork's checkpoint
    assert not Path(image).exists()
    assert len({parent.cid, *(c.cid for c, _ in children)}) == 4
    assert parent.channel.call(("read",), timeout=30) == {"state": "before the fork"}
    parent.channel.call(("write", "parent"), timeout=30)
    assert [c.channel.call(("read",), timeout=30)["state"] for c, _ in children] == [
        "child 0",
        "child 1",
        "child 2",
    ]
    assert parent.channel.call(("read",), timeout=30) == {"state": "parent"}
    assert parent.memory_bytes() > 10 * 2**20  # the sandbox's kernel and the worker's memory


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (its sandbox's kernel, gofer and stubs, for runsc)."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            with contextlib.suppress(OSError):
                kids = [int(k) for k in (task / "children").read_text().split()]
                found += kids
                todo += kids
    return found


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has died)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@needs_gvisor
def test_a_sandbox_killed_from_outside_is_an_invalid_verdict_and_the_host_goes_on():
    tasks, solutions = build(seed=1, per_family=1)
    task = next(t for t in tasks if t["id"] == "click_button-s1-000")
    oracle = next(s for s in solutions if s["id"] == task["id"])["oracle"]
    pool = Pool(HostConfig(mode="fork", sandbox="gvisor", step_timeout_s=5))
    pool.start()
    try:
        env = pool.create(task)
        assert env["valid"]
        audit = pool.verify(env["env_id"])["audit"]
        sandbox = descendants(audit["worker_pid"])
        assert sandbox, "runsc has no sandbox below it"
        os.kill(audit["worker_pid"], signal.SIGKILL)  # runsc, and the sandbox attached to it
        # The sandbox dies with runsc, a moment later: step only once it has (a step sent
        # before would still be answered, and that race is not what this test is about).
        deadline = time.monotonic() + 20
        while any(alive(pid) for pid in sandbox):
            assert time.monotonic() < deadline, "the sandbox outlived its runsc"
            time.sleep(0.05)
        after = pool.step(env["env_id"], oracle[0], 0)
        assert (after["valid"], after["verdict"], after["failed_gates"]) == (
            False,
            "env_failure",
            ["worker_alive"],
        )
        v = pool.verify(env["env_id"])
        assert (v["valid"], v["score"]) == (False, None)
        assert v["audit"]["sandbox"]["container"] == audit["sandbox"]["container"]
        again = pool.create(task)  # the host itself is fine
        assert again["valid"]
        assert pool.verify(pool.step(again["env_id"], oracle[0], 0)["env_id"])["score"] == 1.0
    finally:
        pool.stop()


@needs_gvisor
def test_a_forked_parent_waits_in_its_checkpoint_until_it_is_used_or_closed():
    """A GRPO group closes its parent right after forking it, so the host restores the parent
    only when it is used again: a second fork restores from the same checkpoint, a step wakes it
    in its state, and closing a waiting parent leaves no image behind."""
    tasks, solutions = build(seed=1, per_family=1)
    task = next(t for t in tasks if t["id"] == "click_button-s1-000")
    oracle = next(s for s in solutions if s["id"] == task["id"])["oracle"]
    pool = Pool(HostConfig(mode="fork", sandbox="gvisor", step_timeout_s=10))
    pool.start()
    images = pool.sandboxes.images
    try:
        parent = pool.create(task)
        first = pool.fork(parent["env_id"], 2)["children"]
        assert len(list(images.glob("fork-*"))) == 1  # the parent waits in it; nothing runs
        second = pool.fork(parent["env_id"], 2)["children"]
        assert len(list(images.glob("fork-*"))) == 1  # restored from the same checkpoint
        for child in first + second:
            assert child["valid"] and child["state_sha256"] == parent["state_sha256"]
        woken = pool.step(parent["env_id"], oracle[0], 0)
        assert woken["valid"] and not list(images.glob("fork-*"))
        assert pool.verify(parent["env_id"])["score"] == 1.0
        assert pool.verify(first[0]["env_id"])["score"] == 0.0  # its children never moved

        waiting = pool.create(task)
        pool.fork(waiting["env_id"], 1)
        assert len(list(images.glob("fork-*"))) == 1
        pool.close(waiting["env_id"])
        assert not list(images.glob("fork-*")), "a closed parent left its checkpoint"
    finally:
        pool.stop()


def test_where_gvisor_cannot_run_the_host_says_why(monkeypatch, tmp_path):
    monkeypatch.setattr("envab.envs.host.gvisor.RUNSC", "no-such-runsc")
    assert gvisor_problem("no-such-runsc").startswith("no-such-runsc not found: install")
    with pytest.raises(SandboxUnavailable, match="no-such-runsc not found"):
        Gvisor(tmp_path, ["true"], timeout_s=1)
    with pytest.raises(ValueError, match="sandbox must be one of"):
        HostConfig(mode="fork", sandbox="docker")


def test_a_drums_host_chooses_its_own_sandbox():
    arm = {"backend": "drums", "url": "http://127.0.0.1:9", "sandbox": "gvisor"}
    with pytest.raises(ArmError, match="embedded host's setting"), open_arm(arm):
        pass


@needs_gvisor
def test_a_worker_that_cannot_start_in_a_sandbox_stops_the_host_at_start(tmp_path):
    broken = [sys.executable, "-c", "import no_such_module_of_envab"]
    gv = Gvisor(tmp_path / "gvisor", broken, timeout_s=60)
    with pytest.raises(SandboxUnavailable, match="the worker did not start in a gVisor sandbox"):
        gv.probe()
    assert not list((tmp_path / "gvisor" / "images").glob("*"))


@needs_gvisor
def test_an_agent_that_fills_its_tmpfs_hits_its_bound_and_the_others_go_on(sandboxes):
    from envab.envs.host.gvisor import TMPFS_SIZE

    bound_mib = int(TMPFS_SIZE.rstrip("m"))
    filler, _ = sandboxes.run()
    other, _ = sandboxes.run()
    other.channel.call(("write", "untouched"), timeout=30)
    filler.channel.call(("write", "before"), timeout=30)
    filled = filler.channel.call(("fill",), timeout=120)
    assert filled["errno"] == "ENOSPC"
    assert bound_mib - 16 <= filled["written_mib"] <= bound_mib  # stopped at its own bound
    assert filler.channel.call(("read",), timeout=30) == {"state": "before"}  # still answers
    assert other.channel.call(("read",), timeout=30) == {"state": "untouched"}


@needs_gvisor
@pytest.mark.parametrize(
    ("op", "size"),
    [
        ("bomb", 4 * 1024),  # processes: well past PIDS_LIMIT host tasks
        ("hog", 3 * 1024),  # MiB: past MEMORY_LIMIT_BYTES
    ],
)
def test_a_fork_bomb_or_a_memory_hog_ends_its_own_sandbox_and_the_others_go_on(sandboxes, op, size):
    from envab.envs.channel import ChannelClosed
    from envab.envs.host.gvisor import MEMORY_LIMIT_BYTES, PIDS_LIMIT

    assert size > {"bomb": PIDS_LIMIT, "hog": MEMORY_LIMIT_BYTES // 2**20}[op]
    hostile, _ = sandboxes.run()
    other, _ = sandboxes.run()
    other.channel.call(("write", "untouched"), timeout=30)
    assert hostile.audit()["limits"] == {
        "memory_mib": MEMORY_LIMIT_BYTES // 2**20,
        "pids": PIDS_LIMIT,
    }
    hostile.channel.send((op, size))
    with pytest.raises((ChannelClosed, EOFError, ConnectionError)):
        hostile.channel.recv(180)  # killed at its bound: the host sees its worker die
    assert other.channel.call(("read",), timeout=30) == {"state": "untouched"}
    fresh, _ = sandboxes.run()  # and the host starts the next environment as before
    fresh.channel.call(("write", "after"), timeout=30)
    assert fresh.channel.call(("read",), timeout=30) == {"state": "after"}


@needs_gvisor
def test_a_fork_without_room_on_disk_loses_that_environment_not_the_host(monkeypatch):
    import shutil as real_shutil

    from envab.envs.host import gvisor as gvisor_module

    tasks, solutions = build(seed=1, per_family=1)
    task = next(t for t in tasks if t["id"] == "click_button-s1-000")
    pool = Pool(HostConfig(mode="fork", sandbox="gvisor", step_timeout_s=5))
    pool.start()
    try:
        parent = pool.create(task)
        usage = real_shutil.disk_usage
        monkeypatch.setattr(
            gvisor_module.shutil, "disk_usage", lambda path: usage(path)._replace(free=0)
        )
        with pytest.raises(Exception, match="died while forking") as refused:
            pool.fork(parent["env_id"], 2)
        assert refused.value.failed_gates == ["worker_alive"]
        monkeypatch.setattr(gvisor_module.shutil, "disk_usage", usage)
        again = pool.create(task)  # the host goes on
        assert again["valid"]
    finally:
        pool.stop()


PIDS = Path("/sys/fs/cgroup/pids")


@pytest.mark.skipif(
    not os.access(PIDS, os.W_OK), reason="needs a writable cgroup v1 pids controller (root)"
)
def test_a_killed_hosts_empty_sandbox_cgroups_are_swept_and_a_live_one_is_kept():
    from envab.envs.host.gvisor import sweep_leaked_cgroups

    leaked, live = PIDS / "env-0feedface000", PIDS / "env-0feedface001"
    leaked.mkdir()
    live.mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (live / "cgroup.procs").write_text(str(sleeper.pid))
        # a cgroup made moments ago may be a sandbox another host is starting: kept
        # (only this test's names: other tests' sandboxes start and stop beside it)
        mine = {"root": PIDS.parent, "names": "env-0feedface*"}
        assert sweep_leaked_cgroups(**mine) == 0 and leaked.is_dir()
        assert sweep_leaked_cgroups(**mine, older_than_s=0) == 1
        assert not leaked.exists() and live.is_dir()  # a process in it: not leaked
    finally:
        sleeper.kill()
        sleeper.wait()
        for group in (leaked, live):
            with contextlib.suppress(OSError):
                group.rmdir()
