"""The host's channel to an environment carries data, never code: JSON frames, bounded, each reply
checked against its request. A pickled frame written from inside an environment runs nothing on
the host and ends that environment with a named gate; so does an oversized or malformed frame."""

from __future__ import annotations

import pickle
import socket
import struct

import pytest

from envab.envs import channel as host_channel
from envab.envs.channel import Channel, ChannelCorrupt, PipeChannel, check_reply
from envab.envs.host.pool import Environment, HostConfig, Pool
from envab.envs.protocol import Gate
from envab.envs.xdesktop import server

HEADER = struct.Struct("!I")
MESSAGE = {"screenshot": b"\x89PNG\r\n\x00\xff", "frame": 3, "state_sha256": "ab", "t": (1, 2)}


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


class Planted:
    """What a pickle would run on unpickling: a file written on the host."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_the_two_ends_encode_alike():
    assert host_channel.decode(server.encode(MESSAGE)) == {**MESSAGE, "t": [1, 2]}
    assert server.decode(host_channel.encode(MESSAGE)) == {**MESSAGE, "t": [1, 2]}
    assert host_channel.encode(MESSAGE) == server.encode(MESSAGE)


def test_a_pickled_frame_runs_nothing_and_is_refused(tmp_path):
    planted = tmp_path / "ran"
    ours, theirs = socket.socketpair()
    theirs.sendall(frame(pickle.dumps(Planted(planted))))
    with pytest.raises(ChannelCorrupt, match="not JSON"):
        Channel(ours).recv(timeout=5)
    assert not planted.exists()
    assert pickle.loads(pickle.dumps(Planted(planted))) and planted.exists()  # it would have


def test_an_oversized_frame_is_refused_before_it_is_read():
    ours, theirs = socket.socketpair()
    theirs.sendall(HEADER.pack(2**32 - 1))  # 4 GiB announced, nothing sent
    with pytest.raises(ChannelCorrupt, match="over the"):
        Channel(ours).recv(timeout=5)


def test_pipes_refuse_the_same(tmp_path):
    import os

    r, w = os.pipe()
    os.write(w, frame(b"\x80\x04not json"))
    with pytest.raises(ChannelCorrupt):
        PipeChannel(r, w).recv(timeout=5)


@pytest.mark.parametrize(
    ("request_", "reply"),
    [
        ("step", ["not", "an", "object"]),
        ("step", {"screenshot": "text, not bytes", "frame": 1, "state_sha256": "a"}),
        ("step", {"screenshot": b"x", "frame": True, "state_sha256": "a"}),
        ("step", {"screenshot": b"x", "frame": 1}),
        ("step", {"rejected": 5}),
        ("init", {"state_sha256": "a", "screenshot": b"x", "timings": []}),
        ("hello", {"error": "a copy that cannot greet"}),
        ("http", {"status": "200", "content_type": None, "body": b""}),
        ("state", {"error": {"nested": "not text"}}),
    ],
)
def test_a_reply_not_shaped_as_its_request_expects_is_refused(request_, reply):
    with pytest.raises(ChannelCorrupt):
        check_reply(request_, reply)


@pytest.mark.parametrize(
    "payload",
    [
        b'{"$bytes": "not base64!"}',
        b'{"$bytes": "AA==", "other": 1}',
        b'{"frame": NaN}',
        b"[" * 100_000 + b"]" * 100_000,
        b"\xff\xfe",
    ],
)
def test_malformed_payloads_are_refused(payload):
    with pytest.raises(ChannelCorrupt):
        host_channel.decode(payload)


def test_a_hostile_frame_quarantines_its_environment_with_a_gate(tmp_path):
    """The host's own request path: the environment answers a step with a pickle."""
    planted = tmp_path / "ran"
    ours, theirs = socket.socketpair()
    env = Environment("env-1", {}, Channel(ours), pid=None, expected_sha256=None)
    pool = Pool(HostConfig(mode="restore", sandbox="process"))
    theirs.sendall(frame(pickle.dumps(Planted(planted))))
    assert pool._call(env, ("step", {"action_type": "WAIT"}), 5, Gate.WORKER_ALIVE) is None
    assert env.failed_gates == [str(Gate.WORKER_ALIVE)]
    assert not planted.exists()


PROBE = """
import sys
from envab.envs.xdesktop import server

class Env:  # the operation an agent's command comes in by (/execute, a set-up step)
    def op_command(self, line):
        done = server.run(["sh", "-c", line], timeout=5)
        return {"out": done.stdout, "code": done.returncode}

server.serve_stdio(Env())
"""


def test_no_command_in_the_environment_inherits_the_hosts_channel():
    """The server's channel is its stdin and stdout in a gVisor sandbox: a command the agent runs
    must not read the host's next request (or answer in its place)."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        host = PipeChannel(proc.stdout.fileno(), proc.stdin.fileno())
        assert "pid" in host.recv(10.0)

        def ask(line: str) -> dict:
            host.send(["command", line])
            return host.recv(10.0)

        # With the channel as its stdin, `cat` would wait for (and swallow) the next frame.
        assert ask("cat; echo read") == {"out": "read\n", "code": 0}
        assert ask("readlink /proc/$$/fd/0") == {"out": "/dev/null\n", "code": 0}
        assert ask("echo after") == {"out": "after\n", "code": 0}
    finally:
        proc.kill()
        proc.wait()
