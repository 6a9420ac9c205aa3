"""The QEMU VM's launch waits until its sockets listen, not only until they exist: QEMU binds a
unix socket (its file appears) before it listens on it, and a connection in between is refused.
On a loaded host that window is wide enough to hit (an embedded-default run died so). No QEMU
here: the sockets are made by the test, bound and listening later, as QEMU makes them."""

from __future__ import annotations

import socket
import subprocess
import threading
import time

import pytest

from envab.envs.qemu.vm import VM, LineChannel, VMDied


def bound_not_listening(path):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    return server


def vm_with(proc, run_dir) -> VM:
    vm = VM.__new__(VM)  # the launch's waiting alone, without a QEMU to start
    vm.proc, vm.run_dir = proc, run_dir
    return vm


@pytest.fixture
def alive():
    proc = subprocess.Popen(["sleep", "30"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_socket_that_listens_late_is_connected_when_it_does(tmp_path, alive):
    path = tmp_path / "agent.sock"
    server = bound_not_listening(path)
    with pytest.raises(ConnectionRefusedError):
        LineChannel(path, "agent")  # what the launch did before: one try, refused
    threading.Timer(0.3, server.listen).start()
    vm = vm_with(alive, tmp_path)
    started = time.monotonic()
    channel = vm._when_listening(time.monotonic() + 10, LineChannel, path, "agent")
    assert time.monotonic() - started >= 0.25
    channel.sock.close()
    server.close()


def test_the_monitor_refused_is_retried_like_any_socket(tmp_path, alive):
    server = bound_not_listening(tmp_path / "qmp.sock")
    vm = vm_with(alive, tmp_path)
    with pytest.raises(ConnectionRefusedError):
        vm._monitor()  # QMP's ConnectError, unwrapped to what _when_listening retries
    server.close()


def test_a_socket_that_never_listens_is_a_dead_vm_at_the_deadline(tmp_path, alive):
    path = tmp_path / "agent.sock"
    server = bound_not_listening(path)
    vm = vm_with(alive, tmp_path)
    with pytest.raises(VMDied, match="not listening after"):
        vm._when_listening(time.monotonic() + 0.3, LineChannel, path, "agent")
    server.close()


def test_a_qemu_that_exits_while_its_socket_refuses_is_a_dead_vm(tmp_path):
    path = tmp_path / "agent.sock"
    server = bound_not_listening(path)
    (tmp_path / "qemu.log").write_text("qemu: could not load the snapshot\n")
    proc = subprocess.Popen(["true"])
    proc.wait()
    vm = vm_with(proc, tmp_path)
    with pytest.raises(VMDied, match="qemu exited with 0"):
        vm._when_listening(time.monotonic() + 10, LineChannel, path, "agent")
    server.close()
