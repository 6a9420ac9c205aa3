"""A test-only checker entry (tests/test_checker_sandbox.py): the code a hostile metric would run,
run inside the X desktop's checker process. The host's code names an entry
(`envab.envs.xdesktop.checker.run(..., entry=)`); a task file cannot, so this is loadable only
from a test. The standard library only: it is imported before the checker gives up root, and
also run in the test's own process as the control each probe is measured against.

Each probe answers 1.0 when the confinement held and 0.0 when it did not, or acts (hangs, exits,
writes garbage) so the host's handling can be seen; `facts` reports what the process is by a
request to the environment, which the test's `http` records.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import hashlib
import json
import os
import resource
import socket
import struct
import time


def preload(evaluator) -> None:
    pass


def score(evaluator, http) -> float:
    return PROBES[evaluator["probe"]](evaluator, http)


def write_marker(evaluator, http) -> float:
    """Write a file into a folder of the host's: 1.0 when refused (not its uid's, read-only, or
    not there at all in the checker's root)."""
    try:
        with open(os.path.join(evaluator["folder"], "marker"), "w") as f:
            f.write("the checker wrote here")
    except OSError:
        return 1.0
    return 0.0


def host_files(evaluator, http) -> float:
    """Read each of `evaluator["paths"]` (the host's files) and connect to each of
    `evaluator["sockets"]`: 1.0 when none could be; what came back is reported to /file."""
    reached = []
    for path in evaluator["paths"]:
        try:
            with open(path, "rb") as f:
                f.read(1)
            reached.append(path)
        except OSError:
            pass
    for path in evaluator["sockets"]:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
            reached.append(path)
        except OSError:
            pass
    if http is not None:
        http("POST", "/file", "application/json", json.dumps(reached).encode())
    return 0.0 if reached else 1.0


def connect(evaluator, http) -> float:
    """Reach the host's listeners (its loopback, its other addresses): 1.0 when none answers."""
    for host in evaluator["hosts"]:
        try:
            with socket.create_connection((host, evaluator["port"]), timeout=3):
                return 0.0
        except OSError:
            continue
    return 1.0


def facts(evaluator, http) -> float:
    """What this process is, sent to the environment's `http` (route /file) for the test."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
    report = {
        "resuid": os.getresuid(),
        "resgid": os.getresgid(),
        "groups": os.getgroups(),
        "environ": dict(os.environ),
        "cwd": os.getcwd(),
        "cwd_owner": os.stat(os.getcwd()).st_uid,
        "no_new_privs": status.get("NoNewPrivs", "").strip(),
        "cap_eff": status.get("CapEff", "").strip(),
        "interfaces": [name for _, name in socket.if_nameindex()],
        "rlimits": {
            name: resource.getrlimit(getattr(resource, name))[0]
            for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_NPROC")
        },
    }
    http("POST", "/file", "application/json", json.dumps(report).encode())
    return 1.0


def kernel_calls(evaluator, http) -> float:
    """Reach for what a compromised metric would use to attack the kernel, each call's errno name
    (or "ok") sent to the environment's `http` (route /file) for the test; 1.0 when every one was
    refused. Run in a plain process too, as the control: there they succeed."""
    tried = try_kernel_calls()
    http("POST", "/file", "application/json", json.dumps(tried).encode())
    return 1.0 if set(tried.values()) == {"EPERM"} else 0.0


def try_kernel_calls() -> dict[str, str]:
    """Calls with no lasting effect on the caller, each answered by errno name or "ok": a user
    namespace (made in a child, which then exits), the session keyring's id, an io_uring
    instance, a file handle for this folder, a thread's clone into a new network namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long

    def attempt(call) -> str:
        ctypes.set_errno(0)
        result = call()
        if result < 0:
            return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
        return "ok"

    def in_child(call) -> str:  # a namespace call would change this process: a child makes it
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, attempt(call).encode())
            os._exit(0)
        os.close(write)
        answer = os.read(read, 64).decode()
        os.waitpid(pid, 0)
        return answer

    def io_uring() -> int:
        params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
        fd = libc.syscall(425, 1, params)  # io_uring_setup(1 entry)
        if fd >= 0:
            os.close(fd)
        return fd

    def file_handle() -> int:
        handle = ctypes.create_string_buffer(8 + 128)  # struct file_handle, 128 bytes of it
        ctypes.memmove(handle, struct.pack("I", 128), 4)
        mount_id = ctypes.c_int()
        # name_to_handle_at(AT_FDCWD, ".", handle, &mount_id, 0)
        return libc.syscall(303, -100, b".", handle, ctypes.byref(mount_id), 0)

    return {
        "unshare_user": in_child(lambda: libc.unshare(0x10000000)),  # CLONE_NEWUSER
        "keyctl": attempt(lambda: libc.syscall(250, 0, -3, 0)),  # KEYCTL_GET_KEYRING_ID, session
        "io_uring_setup": attempt(io_uring),
        "name_to_handle_at": attempt(file_handle),
        "bpf": attempt(lambda: libc.syscall(321, 0, None, 0)),  # BPF_MAP_CREATE, no attributes
    }


def orphan(evaluator, http) -> float:
    """Leave a process behind that detaches (its own session): `sleep <marker>`, which the host
    looks for by its command line (the checker's /proc is its own, its pids not the host's)."""
    if os.fork() == 0:
        os.setsid()
        os.execv("/bin/sleep", ["sleep", evaluator["marker"]])
    time.sleep(0.5)  # it has started
    http("POST", "/file", "text/plain", evaluator["marker"].encode())
    return 1.0


def other_route(evaluator, http) -> float:
    """Ask for a route the desktop's getters do not read: 1.0 when refused (403)."""
    reply = http("POST", "/run_python", "application/json", b'{"code": "print(1)"}')
    return 1.0 if reply["status"] == 403 else 0.0


def many_requests(evaluator, http) -> float:
    """Ask the environment for a file `evaluator["requests"]` times: 1.0 if every one came back
    (the host's request budget did not stop it)."""
    for _ in range(evaluator["requests"]):
        http("POST", "/file", "application/x-www-form-urlencoded", b"file_path=big")
    return 1.0


def forge(evaluator, http) -> float:
    """For `evaluator["seconds"]`, rewrite every other checker's job it can find under the host's
    temporary folder (`evaluator["tmp"]`) to an always-true one, and plant a file in its cache:
    1.0 when it could read or write none of them (the other checkers then score their own job)."""
    import glob

    forged = {"evaluator": {"probe": "answer", "value": 1.0}, "browser": False, "cache": False}
    reached = 0
    deadline = time.monotonic() + evaluator["seconds"]
    while time.monotonic() < deadline:
        for home in glob.glob(os.path.join(evaluator["tmp"], "envab-checker-*")):
            if os.path.realpath(home) == os.path.realpath(os.getcwd()):
                continue  # its own
            job, planted = os.path.join(home, "job.json"), os.path.join(home, "planted")
            for attempt in (
                lambda j=job: _write(j, json.dumps(forged)),
                lambda j=job: _read(j),
                lambda p=planted: _write(p, "x"),
                lambda h=home: os.listdir(h),
            ):
                try:
                    attempt()
                    reached += 1
                except OSError:
                    pass
        time.sleep(0.02)
    http("POST", "/file", "text/plain", str(reached).encode())
    return 1.0 if reached == 0 else 0.0


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def hang(evaluator, http) -> float:
    time.sleep(3600)
    return 1.0


def exit_early(evaluator, http) -> float:
    os._exit(3)


def allocate(evaluator, http) -> float:
    """More memory than the checker's address-space limit: MemoryError in the checker."""
    return float(len(bytearray(evaluator["bytes"])) > 0)


def raw_frame(evaluator, http) -> float:
    """Write `evaluator["frame"]` straight onto the checker's channel to the host, as code in the
    checker process can (it finds the channel among the live objects), then wait."""
    from envab.envs.channel import PipeChannel

    (channel,) = [o for o in gc.get_objects() if isinstance(o, PipeChannel)]
    payload = evaluator["frame"].encode()
    size = evaluator.get("size", len(payload))
    os.write(channel.write_fd, struct.pack("!I", size) + payload)
    time.sleep(3600)
    return 1.0


def raw_bytes(evaluator, http) -> float:
    """Bytes that are no frame at all on the checker's channel, then the end of the process."""
    from envab.envs.channel import PipeChannel

    (channel,) = [o for o in gc.get_objects() if isinstance(o, PipeChannel)]
    os.write(channel.write_fd, evaluator["bytes"].encode())
    os._exit(0)


def answer(evaluator, http):
    """Whatever `evaluator["value"]` holds, as the score."""
    return evaluator["value"]


def _browser(evaluator) -> socket.socket:
    """A connection to the browser's debugging port as desktop-env's getters make it."""
    return socket.create_connection(("127.0.0.1", evaluator.get("port", 1337)), timeout=10)


def browser_echo(evaluator, http) -> float:
    """Say `say` on the browser's port and send what came back (`want` bytes, or to the end; its
    sha256 with `digest`) to the environment's /file; the connection is left open, as a getter
    that crashed leaves it."""
    conn = _browser(evaluator)
    conn.sendall(evaluator["say"].encode())
    got = b""
    while len(got) < evaluator["want"]:
        chunk = conn.recv(2**16)
        if not chunk:
            break
        got += chunk
    if evaluator.get("digest"):
        got = hashlib.sha256(got).digest()
    http("POST", "/file", "application/octet-stream", got)
    return 1.0


def browser_closed(evaluator, http) -> float:
    """1.0 when the browser's port is closed to this checker: refused, or ended unanswered."""
    try:
        conn = _browser(evaluator)
    except OSError:
        return 1.0
    with conn:
        conn.sendall(b"GET /json/version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        return 1.0 if conn.recv(1) == b"" else 0.0


PROBES = {
    f.__name__: f
    for f in (
        *(write_marker, host_files, connect, facts, kernel_calls, orphan, other_route),
        many_requests,
        forge,
        hang,
        *(exit_early, allocate, raw_frame, raw_bytes, answer, browser_echo, browser_closed),
    )
}
