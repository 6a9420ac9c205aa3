"""The X desktop's checker process: OSWorld's getters and metrics run here, never in the host.

A task file names the getters and metrics, and everything a getter fetches comes from the
environment, so both are untrusted; the freeze refuses the metrics known to evaluate or execute
text (`envs/tasks/evaluators.py`), and this is the line behind it. The host (`run`) starts
`python -m envab.envs.xdesktop.checker` for one evaluation, which confines itself
(`envab.envs.xdesktop.confine`) before it runs anything the task names:

- before it reads the task: no new privileges; a process namespace of its own (nothing it starts
  outlives it) and a network namespace of its own with only loopback, where the relay that
  desktop-env's controller talks to listens inside this process; each HTTP request the relay
  gets goes to the host as a frame on the process's standard output, and the host answers it on
  standard input with the environment's `http` callable, only for the routes the desktop's
  getters read (`routes`; anything else is answered 403). The environment still serves the
  files; the checker reaches nothing else. A task whose getters ask the browser gets one more
  way out: its debugging port, as byte streams in turns (`envab.envs.xdesktop.debugging`),
  which the host carries to the environment's browser and nowhere else. And a root of its own
  (`confine.private_root`, a mount namespace, and a user namespace where the host is not root):
  the system's folders and the interpreter's read-only, its own home, and nothing else of the
  host's (its home, its /tmp with other checkers' folders and the VMs' sockets, the checkout's
  results, receipts and keys), so a checker that shares the host's uid still reaches none of it.
- having imported the metrics and getters the task names (`preload`, from desktop-env's own
  modules by name only): resource limits, an unprivileged uid and gid *of its own* (as root:
  one of `confine.CHECKER_IDS`, held by this evaluation alone while it runs, `checker_ids`; a
  host that is not root keeps its uid),
  no capabilities, a seccomp filter refusing the kernel's facilities no metric needs
  (`confine.filter_calls`: tracing, mounts, new namespaces, BPF, keyrings, io_uring, and the
  like), an environment holding only HOME and TMPDIR, both its private folder (mode
  0700, owned by its own uid, removed afterwards), where its cache lives and its cwd is. Only then
  does a getter or metric run. Checkers that run side by side thus cannot read or write each
  other's folders; the job (the evaluator it scores) is a root-owned file only the checker's
  still-root start reads, and its score frame names the digest of the job it read, which the
  host checks against the job it wrote: a checker cannot score another job than its own.

Frames are the channel's (`envs/channel.py`: length-prefixed JSON, bytes as base64): the
checker sends `{"http": [method, path, content type, body]}` or `{"browser": [stream, data,
close, wait]}` (at most `REQUEST_MAX` bytes) and ends with `{"score": x}` or `{"error":
name}`. The host relays at most `Limits.requests` requests and `Limits.relayed_bytes` of the
environment's answers for one evaluation, and a browser turn's answer of at most
`debugging.ANSWER_MAX` bytes. The host takes a score only as a finite number in [0, 1];
anything else — an error, a crash, garbage or an oversize frame on its output, a budget passed,
no score by the total deadline (then it is killed) — raises `CheckerFailed`, whose `failure`
the pool records as the audit flag `checker_<failure>` of an invalid attempt (gate
verifier_available).

Where the confinement cannot be had (no network or process namespace: not root and no user
namespaces; a uid change refused), the checker refuses with `{"error": "ConfinementError"}`,
failure `sandbox`. It never runs a metric unconfined: a task set a machine cannot score is
better refused than a host that runs a task file's choice of code.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, replace
from pathlib import Path

from envab.envs.channel import (
    ChannelClosed,
    ChannelCorrupt,
    ChannelTimeout,
    FrameTooLarge,
    PipeChannel,
    check_reply,
)
from envab.envs.xdesktop import confine, debugging
from envab.envs.xdesktop.confine import ConfinementError, Limits
from envab.hashing import sha256_bytes as sha256

log = logging.getLogger(__name__)

DEFAULT_ENTRY = "envab.envs.xdesktop.evaluate"  # its `preload(evaluator)`, `score(evaluator, http)`
REQUEST_MAX = 2**20  # the largest frame the host reads from a checker: a request, or its score
EXIT_GRACE_S = 2.0  # how long a checker that answered a score gets to exit before it is killed
STDERR_TAIL = 2000  # characters of a failed checker's standard error kept in the log
JOB = "job.json"
# What the in-environment server answers for a route its desktop does not provide (the
# accessibility tree where the image carries no AT-SPI): no score can rest on such a request.
NOT_PROVIDED = 501
# Routes a score may rest on only when they answer: desktop-env's tree getters read any other
# status (a tree refused as too large, one that could not be walked) as no address bar, and
# its metrics score that 0.
WHOLE_ANSWERS = frozenset({"/accessibility"})
# OSWorld's cache folder as the evaluation's earlier steps left it: what a `postconfig` command
# printed, kept under the name its step gives (`stdout`, `stderr`), which desktop-env's
# `cache_file` getter reads. The environment wrote it, so it is checked like any answer.
CACHE = "cache"
CACHE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")  # a plain file name, no folder
CACHE_FILES, CACHE_BYTES = 16, 32 * 2**20

Http = Callable[[str, str, str, bytes], Mapping]


class CheckerFailed(RuntimeError):
    """No valid score from the checker process; `failure` names why: timeout, crash (it raised
    or died), garbage (a frame that is no message, a cache that is not files), oversize (a frame,
    an answer or an evaluation's relay budget past its limit),
    bad_score, environment (the environment could not answer its request, or answered that
    it does not provide what was asked), sandbox (the confinement was refused)."""

    def __init__(self, failure: str, detail: str):
        super().__init__(detail)
        self.failure = failure


# --- the host's side ---------------------------------------------------------------------------


def run(
    evaluator: Mapping,
    http: Http,
    routes: Collection[str],
    limits: Limits | None = None,
    entry: str = DEFAULT_ENTRY,
    browser: debugging.Turn | None = None,
    cache: Mapping[str, bytes] | None = None,
) -> float:
    """The score of `evaluator` from a confined checker process, which reads the environment
    only through `http`, on `routes`, and, given `browser` (the environment's turns of a stream
    to its browser's debugging port), through that port; `cache`: the files its cache folder
    starts with (`cache_files`). `entry`: the module (or a .py file) that scores; the host's
    code names it, a task file cannot."""
    limits = limits or Limits()
    try:
        files = cache_files(cache or {})
    except CheckerFailed as e:
        log.warning("checker failed (%s): %s", e.failure, e)
        raise
    streams = debugging.Streams(browser) if browser is not None else None
    with contextlib.ExitStack() as held:
        if os.geteuid() == 0 and limits.uid == confine.NOBODY:  # ids of its own, while it runs
            uid = held.enter_context(confine.checker_ids())
            limits = replace(limits, uid=uid, gid=uid)
        return _run(evaluator, files, http, routes, limits, entry, streams)


def _run(evaluator, files, http, routes, limits, entry, streams) -> float:
    home = tempfile.mkdtemp(prefix="envab-checker-")  # mode 0700, its own uid's below
    try:
        job = {"evaluator": evaluator, "browser": streams is not None, "cache": bool(files)}
        # The job stays the host's (root's, mode 0600 as root): only the checker's start, before
        # its uid changes, reads it; the score it sends back names the digest of what it read.
        job_bytes = json.dumps(job).encode()
        Path(home, JOB).write_bytes(job_bytes)
        Path(home, JOB).chmod(0o600)
        if files:
            Path(home, CACHE).mkdir()
            for name, data in files.items():
                Path(home, CACHE, name).write_bytes(data)
        if os.geteuid() == 0:
            cache = Path(home, CACHE)
            for path in (Path(home), *((cache, *cache.rglob("*")) if files else ())):
                os.chown(path, limits.uid, limits.gid)
        with tempfile.TemporaryFile() as stderr:
            argv = ["--home", home, "--entry", entry, "--limits", json.dumps(asdict(limits))]
            proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-m", __name__, *argv],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=home,
                env={"HOME": home, "TMPDIR": home},
                start_new_session=True,  # its own process group, killed as one
            )
            grace = 0.0
            try:
                score = _serve(proc, http, frozenset(routes), limits, streams, sha256(job_bytes))
                grace = EXIT_GRACE_S
                return score
            except CheckerFailed as e:
                stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - STDERR_TAIL))
                tail = stderr.read().decode("utf-8", "replace").strip()
                log.warning("checker failed (%s): %s\n%s", e.failure, e, tail)
                raise
            finally:
                _end(proc, grace)
                if streams is not None:
                    streams.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _serve(
    proc: subprocess.Popen,
    http: Http,
    routes: frozenset,
    limits: Limits,
    streams: debugging.Streams | None,
    job_sha256: str,
) -> float:
    """Answer the checker's requests until its score, its deadline or its end. A score must
    name the digest of the job this host wrote for it (`job_sha256`)."""
    channel = PipeChannel(proc.stdout.fileno(), proc.stdin.fileno(), max_frame=REQUEST_MAX)
    deadline = time.monotonic() + limits.deadline_s
    requests = relayed = 0
    while True:
        try:
            message = channel.recv(timeout=max(0.0, deadline - time.monotonic()))
        except ChannelTimeout:
            raise CheckerFailed("timeout", f"no score within {limits.deadline_s} s") from None
        except FrameTooLarge as e:
            raise CheckerFailed("oversize", str(e)) from None
        except ChannelCorrupt as e:
            raise CheckerFailed("garbage", str(e)) from None
        except ChannelClosed:
            ended = _ended(proc)
            raise CheckerFailed("crash", f"the checker ended ({ended}) without a score") from None
        kind = next(iter(message), None) if isinstance(message, dict) else None
        if kind == "score" and set(message) <= {"score", "job"}:
            score = _score(message["score"])
            if message.get("job") != job_sha256:
                raise CheckerFailed("garbage", "a score for another job than the one it was given")
            return score
        if kind is None or len(message) != 1:
            raise CheckerFailed("garbage", "a frame that is not a checker's message")
        if kind == "error":
            name = str(message["error"])[:100]
            if name == ConfinementError.__name__:
                raise CheckerFailed("sandbox", "the checker's confinement was refused")
            raise CheckerFailed("crash", f"the checker raised {name}")
        if kind not in ("http", "browser"):
            raise CheckerFailed("garbage", f"a message {kind[:40]!r}")
        requests += 1
        if requests > limits.requests:
            raise CheckerFailed("oversize", f"more than {limits.requests} requests")
        if kind == "http":
            reply = _answer(message["http"], http, routes)
        else:
            reply = _turn(message["browser"], streams)
        relayed += len(reply.get("body", b"")) + len(reply.get("data", b""))
        if relayed > limits.relayed_bytes:
            raise CheckerFailed(
                "oversize", f"the environment's answers passed {limits.relayed_bytes} bytes"
            )
        try:
            channel.send(reply)
        except FrameTooLarge as e:
            raise CheckerFailed("oversize", f"the environment's answer: {e}") from None
        except ChannelClosed:
            ended = _ended(proc)
            raise CheckerFailed("crash", f"the checker ended ({ended}) mid-request") from None


def _answer(request, http: Http, routes: frozenset) -> dict:
    """The environment's answer to one relayed request, or 403 for a route not in `routes`."""
    shapes = (str, str, str, bytes)
    if not (
        isinstance(request, list)
        and len(request) == len(shapes)
        and all(isinstance(v, t) for v, t in zip(request, shapes, strict=True))
    ):
        raise CheckerFailed("garbage", "a request that is not [method, path, type, body]")
    method, path, content_type, body = request
    if method not in ("GET", "POST") or path.split("?", 1)[0] not in routes:
        return {"status": 403, "content_type": "text/plain", "body": b"not a checker's route"}
    try:
        reply = http(method, path, content_type, body)
    except Exception as e:  # the environment's channel: dead, late or out of step
        raise CheckerFailed("environment", f"{type(e).__name__}: {e}") from None
    route = path.split("?", 1)[0]
    if reply["status"] == NOT_PROVIDED:  # a getter would read "no answer" as an empty one
        raise CheckerFailed("environment", f"this desktop does not provide {route[:60]}")
    if route in WHOLE_ANSWERS and reply["status"] != 200:
        raise CheckerFailed("environment", f"{route} answered {reply['status']}")
    return {k: reply[k] for k in ("status", "content_type", "body")}


def _turn(request, streams: debugging.Streams | None) -> dict:
    """The environment's answer to one turn of a browser stream; a checker whose task's getters
    do not ask the browser finds the port closed."""
    try:
        stream, data, close, wait = debugging.turn(request)
    except ValueError as e:
        raise CheckerFailed("garbage", str(e)) from None
    if streams is None:
        return {"data": b"", "open": False}
    try:
        return streams(stream, data, close, wait)
    except debugging.AnswerTooLarge as e:
        raise CheckerFailed("oversize", str(e)) from None
    except Exception as e:  # the environment's channel: dead, late or out of step
        raise CheckerFailed("environment", f"{type(e).__name__}: {e}") from None


def cache_files(files) -> dict[str, bytes]:
    """`files` if they are what a cache folder may start with: at most CACHE_FILES, each a
    plain file name (CACHE_NAME) and bytes, CACHE_BYTES in all; else `CheckerFailed` (the
    environment's answer is garbage, or oversize), before any checker starts."""
    if not isinstance(files, Mapping) or len(files) > CACHE_FILES:
        raise CheckerFailed("garbage", f"a cache that is not at most {CACHE_FILES} files")
    for name, data in files.items():
        if not (isinstance(name, str) and CACHE_NAME.match(name) and isinstance(data, bytes)):
            raise CheckerFailed("garbage", f"a cache file {str(name)[:40]!r} that is not a "
                                           "plain file name with bytes")  # fmt: skip
    if sum(len(data) for data in files.values()) > CACHE_BYTES:
        raise CheckerFailed("oversize", f"a cache of more than {CACHE_BYTES} bytes")
    return dict(files)


def _score(value) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not 0.0 <= value <= 1.0
    ):
        raise CheckerFailed("bad_score", f"the checker answered {str(value)[:40]!r}")
    return float(value)


def _ended(proc: subprocess.Popen) -> str:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1.0)
    code = proc.returncode
    if code is None:
        return "still running"
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"


def _end(proc: subprocess.Popen, grace: float) -> None:
    """Kill the checker's process group, whatever it is doing, and reap it. One that answered
    gets `grace` seconds to exit first, so that it reaps its own (the first process of its
    namespace) rather than leave that to the machine's init."""
    with contextlib.suppress(OSError):
        proc.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.stdout.close()
    proc.wait()


# --- the checker's side ------------------------------------------------------------------------


class _Host:
    """The checker's ways to the environment, over its standard output: one request or turn
    at a time."""

    def __init__(self, channel: PipeChannel):
        self.channel = channel
        self.lock = threading.Lock()

    def _ask(self, kind: str, request: list) -> Mapping:
        with self.lock:
            self.channel.send({kind: request})
            return check_reply(kind, self.channel.recv())

    def http(self, method: str, path: str, content_type: str, body: bytes) -> Mapping:
        return self._ask("http", [method, path, content_type, bytes(body)])

    def browser(self, stream: int, data: bytes, close: bool, wait: float) -> Mapping:
        return self._ask("browser", [stream, bytes(data), close, wait])


def _entry(name: str):
    if name.endswith(".py"):
        spec = importlib.util.spec_from_file_location("envab_checker_entry", name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="env-ab's X desktop checker process")
    p.add_argument("--home", required=True)
    p.add_argument("--entry", default=DEFAULT_ENTRY)
    p.add_argument("--limits", default="{}")
    args = p.parse_args(argv)
    # The frames keep the descriptors they came on; standard input becomes /dev/null and standard
    # output the error stream, so a metric that prints (exact_match does) cannot write a frame.
    channel = PipeChannel(os.dup(0), os.dup(1))
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)
    try:
        confine.no_new_privileges()
        entry_folder = (
            [os.path.dirname(os.path.abspath(args.entry))] if args.entry.endswith(".py") else []
        )
        confine.isolate(args.home, keep=entry_folder)
        job_bytes = Path(args.home, JOB).read_bytes()
        job = json.loads(job_bytes)
        evaluator = job["evaluator"]
        module = _entry(args.entry)
        module.preload(evaluator)
        confine.drop(Limits(**json.loads(args.limits)))
        confine.filter_calls()
        host = _Host(channel)
        if job.get("browser"):  # after the drop: its threads are the unprivileged uid's too
            debugging.PortRelay(host.browser).start()
        cache = {"cache": Path(args.home, CACHE)} if job.get("cache") else {}
        score = module.score(evaluator, host.http, **cache)
        try:
            answer = {"score": float(score), "job": sha256(job_bytes)}
        except (TypeError, ValueError, OverflowError):
            answer = {"error": "NotAScore"}
    except Exception as e:  # anything a metric raises is a failed check, named by its type
        print(f"checker: {type(e).__name__}: {e}", file=sys.stderr)
        answer = {"error": type(e).__name__}
    try:
        channel.send(answer)
    except (ChannelClosed, ValueError):  # a NaN score: no valid frame holds it
        channel.send({"error": "NotAScore"})
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
