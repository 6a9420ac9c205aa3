"""DrumsBackend / DrumsSession: `envab.envs.protocol` over HTTP with httpx.

Exercised against the embedded host (`envab.envs.host`) only, never against a real drumsd.

- The token comes from an argument, `DRUMS_TOKEN_FILE` or `DRUMS_TOKEN` (`envab.envs.auth`); it
  lives in the request headers only and is never logged, put in a repr or in an exception message.
- Every request has a timeout. A request that never reached the host (connection refused) is
  retried; a request that may have reached it is retried only when it is idempotent (health,
  verify, close), never create, fork or step.
- A gate failure, a dead host, a timeout or a lost environment gives an *invalid* observation or
  verification with its verdict and failed gate, never a score of 0. Only a request that is wrong
  in itself (bad task, bad action, no token) raises.
- Nothing a host says is believed unchecked (a host may be hostile or buggy): every field is
  checked for its JSON type and range (`envs/drums/answer.py`), an answer may be at most
  `max_response_bytes` long and must arrive whole within the request's deadline (a total one, not
  per read: a host trickling bytes is cut off at it), redirects are not followed (the token goes
  to this host only). A malformed answer is an invalid attempt under gate `host_answer`, with what
  was wrong in the audit (`host_answer_error`), never an exception that stops training.
- A full host (429 or 503 to create or fork, or a 400 saying it holds its maximum) is waited out
  with backoff `full_retries` times, then the attempt is invalid (`host_reachable`, "host full").
"""

from __future__ import annotations

import logging
import os
import random
import re
import socket
import time
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpcore
import httpx

import envab.envs.drums.answer as answer
from envab.envs.auth import TokenError, read_token
from envab.envs.protocol import (
    ActionRejected,
    Backend,
    ForkUnsupported,
    Gate,
    Observation,
    Session,
    Verification,
    check_action,
    reported,
    verdict_for,
)

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({429, 502, 503, 504})
# What a full host says to create or fork: 429 or 503, or (the embedded host) a 400 naming its
# maximum; the words a drumsd or a gateway in front of one may use as well.
_FULL_STATUS = frozenset({429, 503})
_FULL = re.compile(r"\bfull\b|\bcapacity\b|\bmaximum of \d+ environments\b", re.IGNORECASE)
_MAX_BACKOFF_S = 30.0
# The end of the request in flight on this thread (time.monotonic()); every socket wait of that
# request is cut to it (_DeadlineStream), so a host that trickles bytes cannot hold a step forever.
_DEADLINE: ContextVar[float | None] = ContextVar("drums_request_deadline", default=None)


class DrumsError(RuntimeError):
    """The host refused a request that is wrong in itself (auth, bad task, unknown route)."""


class _Unreachable(Exception):
    """Internal: the host gave no usable answer (none, 5xx, malformed, full); carries the gate to
    fail. `full`: the host said it is full, so the request may be sent again after a wait."""

    def __init__(self, gate: str, reason: str, *, full: bool = False, wait_s: float | None = None):
        super().__init__(reason)
        self.gate = gate
        self.reason = reason
        self.full = full
        self.wait_s = wait_s  # the host's Retry-After, where it sent one


def _malformed(where: str, e: ValueError) -> _Unreachable:
    return _Unreachable(Gate.HOST_ANSWER, f"{where}: {answer.line(e)}")


_DECODE = object()


def _observation(body: Any, *, done: bool | None = None, screenshot: Any = _DECODE) -> Observation:
    """The host's observation, every field checked (a malformed one raises ValueError). A verdict
    or gate this client has never seen is kept by name and read as an environment failure
    (protocol.reported), never a crash. A valid observation's screenshot is decoded from the
    answer unless given (a fork child shows its parent's); an invalid one's is dropped unread.
    `done` is the answer's (a step's) unless given."""
    body = answer.obj(body, "the answer")
    valid, verdict, gates = reported(*answer.verdict(body))
    generation = answer.generation(body)
    state = answer.digest(body, "state_sha256")
    done = answer.flag(body, "done", default=False) if done is None else done
    if not valid:
        screenshot = None
    elif screenshot is _DECODE:
        screenshot = answer.screenshot(body.get("screenshot_png"))
    return Observation(generation, screenshot, valid, verdict, gates, done, state)


def _invalid(generation: int, gate: str) -> Observation:
    return Observation(generation, None, False, str(verdict_for([gate])), (str(gate),))


def _why(gates, reason: str | None) -> dict:
    """The audit of an invalid verification the client decided: its reason, and for a malformed
    answer the same line as `host_answer_error`."""
    audit = {"error": reason}
    if str(Gate.HOST_ANSWER) in {str(g) for g in gates}:
        audit["host_answer_error"] = reason
    return audit


def _left(timeout: float | None, late: type[Exception]) -> float | None:
    """`timeout` cut to what is left of the request's deadline; `late` once it has passed."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise late("past the request's deadline")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the deadline of the request using it."""

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> _DeadlineStream:
        wait = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, wait))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self):
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        wait = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._inner.connect_tcp(host, port, wait, local_address, socket_options)
        )

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        wait = _left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_unix_socket(path, wait, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _DeadlineTransport(httpx.HTTPTransport):
    """httpx's own transport on a network backend that cuts every socket wait to the request's
    deadline. httpx's timeouts are per read, so without it a host sending a byte a second would
    hold a request for as long as it liked."""

    def __init__(self, limits: httpx.Limits, socket_options: list):
        super().__init__(limits=limits, socket_options=socket_options)
        # httpx (0.28) takes no network backend, so the pool it built, still without a
        # connection, is replaced by the same pool on ours. tests/test_hostile_host.py's trickle
        # rows fail if an httpx upgrade stops this pool from being the one used.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            socket_options=socket_options,
            network_backend=_DeadlineBackend(),
        )


@dataclass(frozen=True)
class _Reply:
    status: int
    reason: str
    headers: httpx.Headers
    content: bytes


def _wait_s(headers: httpx.Headers) -> float | None:
    """A Retry-After in seconds, bounded; None when absent or not a plain number."""
    value = headers.get("retry-after", "").strip()
    return min(float(value), _MAX_BACKOFF_S) if value.isdigit() else None


class DrumsBackend(Backend):
    """Sessions on one Drums host. Thread-safe: one httpx connection pool for all sessions."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        token_file: str | Path | None = None,
        connect_timeout_s: float = 5.0,
        step_timeout_s: float = 30.0,
        create_timeout_s: float = 120.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        full_retries: int = 6,
        full_backoff_s: float = 1.0,
        max_response_bytes: int = answer.MAX_RESPONSE_BYTES,
        max_connections: int = 64,
        transport: httpx.BaseTransport | None = None,
    ):
        """`step_timeout_s` and `create_timeout_s` are each request's whole deadline (every read
        of it included); `full_retries` waits of `full_backoff_s` doubling (at most 30 s, or the
        host's Retry-After) before a full host's create or fork is an invalid attempt. A
        `transport` of the caller's own (tests) has its deadline checked between reads only."""
        self.url = url.rstrip("/")
        self.connect_timeout_s = connect_timeout_s
        self.step_timeout_s = step_timeout_s
        self.create_timeout_s = create_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.full_retries = full_retries
        self.full_backoff_s = full_backoff_s
        self.max_response_bytes = max_response_bytes
        try:
            authorization = f"Bearer {read_token(token, token_file)}"
        except TokenError as e:  # no token is a request wrong in itself, as it always was here
            raise DrumsError(str(e)) from None
        # Nagle's algorithm plus delayed ACKs would add ~40 ms to every small POST.
        transport = transport or _DeadlineTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )
        self._http = httpx.Client(
            base_url=self.url,
            transport=transport,
            # Uncompressed answers only: the size limit is then the memory an answer can take
            # (no gzip bomb), and an answer compressed anyway is malformed.
            headers={"Authorization": authorization, "Accept-Encoding": "identity"},
            timeout=httpx.Timeout(step_timeout_s, connect=connect_timeout_s),
            follow_redirects=False,  # a redirect would carry the token to another host
        )
        self._can_fork: bool | None = None

    def __repr__(self) -> str:
        return f"DrumsBackend(url={self.url!r})"

    @classmethod
    def from_env(cls, **kwargs) -> DrumsBackend:
        """URL from DRUMS_URL, token from DRUMS_TOKEN_FILE or DRUMS_TOKEN."""
        url = os.environ.get("DRUMS_URL")
        if not url:
            raise DrumsError("DRUMS_URL is not set")
        return cls(url, **kwargs)

    # --- the protocol -----------------------------------------------------------------------

    @property
    def can_fork(self) -> bool:
        """What the host's health says (a JSON bool; absent is False), or one DrumsError line."""
        if self._can_fork is None:
            try:
                self._can_fork = answer.flag(self.health(), "can_fork", default=False)
            except _Unreachable as e:
                raise DrumsError(
                    f"the Drums host at {self.url} does not answer: {e.reason}"
                ) from None
            except ValueError as e:
                raise DrumsError(f"GET /v1/health: {answer.line(e)}") from None
        return self._can_fork

    def health(self) -> dict:
        return self._request("GET", "/v1/health", idempotent=True)

    def preflight(self) -> dict:
        """The host's health, asked with this token before any work; or one DrumsError line
        saying why not (unreachable, or the token refused)."""
        try:
            return self.health()
        except _Unreachable as e:
            raise DrumsError(f"the Drums host at {self.url} does not answer: {e.reason}") from None

    def create(self, task: Mapping, *, faults: Mapping | None = None) -> DrumsSession:
        """An environment for `task`, sent whole."""
        return self._create({"task": dict(task)}, task.get("id"), faults)

    def create_by_id(self, task_id: str, *, faults: Mapping | None = None) -> DrumsSession:
        """An environment for a task the host serves by id (as drumsd serves its pinned OSWorld
        checkout); the session's `task_sha256` says which task the host used."""
        return self._create({"task_id": task_id}, task_id, faults)

    def _create(self, body: dict, task_id: str | None, faults: Mapping | None) -> DrumsSession:
        if faults:
            body["faults"] = dict(faults)
        try:
            reply = self._request(
                "POST", "/v1/envs", json=body, timeout=self.create_timeout_s, wait_if_full=True
            )
        except _Unreachable as e:
            log.warning("create %s: %s", task_id, e.reason)
            return DrumsSession(self, None, _invalid(0, e.gate), task_id, reason=e.reason)
        env_id = None
        try:
            env_id = answer.env_id(reply.get("env_id"))
            obs = _observation(reply, done=False)
            timings, task_sha256 = answer.timings(reply), answer.digest(reply, "task_sha256")
        except ValueError as e:
            bad = _malformed("POST /v1/envs", e)
            log.warning("create %s: %s", task_id, bad.reason)
            # With a readable id, closing the session still frees what the host holds.
            return DrumsSession(self, env_id, _invalid(0, bad.gate), task_id, reason=bad.reason)
        session = DrumsSession(self, env_id, obs, task_id, timings=timings)
        session.task_sha256 = task_sha256
        return session

    def close(self) -> None:
        self._http.close()

    # --- transport --------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool = False,
        timeout: float | None = None,
        json=None,
        wait_if_full: bool = False,
    ) -> dict:
        """One call; retried on a refused connection, and on any failure when idempotent. With
        `wait_if_full` (create, fork) a full host is asked again after a backoff, a bounded
        number of times: it made nothing, so sending again is safe."""
        for wait in range(1 + (self.full_retries if wait_if_full else 0)):
            try:
                return self._call(method, path, idempotent, timeout, json, wait_if_full)
            except _Unreachable as e:
                if not e.full:
                    raise
                if wait == self.full_retries:
                    reason = f"{e.reason}; still full after {wait + 1} tries"
                    raise _Unreachable(e.gate, reason) from None
                delay = self.full_backoff_s * 2**wait if e.wait_s is None else e.wait_s
                # Jitter, so the many sessions a full host turned away do not return together.
                time.sleep(min(delay, _MAX_BACKOFF_S) * random.uniform(1.0, 1.25))
        raise AssertionError("unreachable")

    def _call(
        self, method: str, path: str, idempotent: bool, timeout: float | None, json, full: bool
    ) -> dict:
        attempts = 1 + self.retries
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                r = self._exchange(method, path, json, timeout or self.step_timeout_s)
            except httpx.ConnectError as e:  # never reached the host: always safe to retry
                reason = f"cannot connect to {self.url} ({type(e).__name__})"
                if last:
                    raise _Unreachable(Gate.HOST_REACHABLE, reason) from None
            except httpx.TimeoutException:
                reason = f"{method} {path}: no answer within the timeout"
                if last or not idempotent:
                    raise _Unreachable(Gate.STEP_TIMEOUT, reason) from None
            except httpx.TransportError as e:
                reason = f"{method} {path}: {type(e).__name__}"
                if last or not idempotent:
                    raise _Unreachable(Gate.HOST_REACHABLE, reason) from None
            else:
                if r.status in _RETRY_STATUS and idempotent and not last:
                    pass
                else:
                    return self._decode(r, method, path, full)
            time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    def _exchange(self, method: str, path: str, json, limit_s: float) -> _Reply:
        """One request and its whole answer, within `limit_s` seconds in all and at most
        `max_response_bytes` long, or an exception: httpx's timeout past the deadline, and
        `_Unreachable` (host_answer) for an answer too long or compressed."""
        deadline = time.monotonic() + limit_s
        where = f"{method} {path}"
        token = _DEADLINE.set(deadline)
        try:
            timeout = httpx.Timeout(limit_s, connect=min(self.connect_timeout_s, limit_s))
            with self._http.stream(method, path, json=json, timeout=timeout) as r:
                encoding = r.headers.get("content-encoding", "identity").strip().lower()
                if encoding != "identity":
                    reason = f"{where}: a {answer.line(encoding, 20)} answer (identity was asked)"
                    raise _Unreachable(Gate.HOST_ANSWER, reason)
                declared = r.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.max_response_bytes:
                    reason = f"{where}: an answer of {declared} bytes, over the limit"
                    raise _Unreachable(Gate.HOST_ANSWER, reason)
                chunks, size = [], 0
                for chunk in r.iter_bytes():  # identity-encoded: the bytes as they came
                    size += len(chunk)
                    if size > self.max_response_bytes:
                        reason = f"{where}: an answer over {self.max_response_bytes} bytes"
                        raise _Unreachable(Gate.HOST_ANSWER, reason)
                    if time.monotonic() > deadline:  # a transport that is not _DeadlineTransport
                        raise httpx.ReadTimeout("past the request's deadline", request=r.request)
                    chunks.append(chunk)
                return _Reply(r.status_code, r.reason_phrase, r.headers, b"".join(chunks))
        finally:
            _DEADLINE.reset(token)

    @staticmethod
    def _decode(r: _Reply, method: str, path: str, full: bool = False) -> dict:
        """A success's JSON object, checked; otherwise the exception its status means. `full`:
        a full host's answer is `_Unreachable(full=True)`, to be waited out."""
        where = f"{method} {path}"
        if 200 <= r.status < 300:
            if r.status == 204 or (method == "DELETE" and not r.content):
                return {}
            try:
                return answer.obj(answer.parse(r.content), "the answer")
            except ValueError as e:
                raise _malformed(where, e) from None
        try:
            body = answer.parse(r.content)
        except ValueError:
            body = None
        body = body if isinstance(body, dict) else {}
        said = body.get("error")
        message = answer.line(said if isinstance(said, str) and said else r.reason)
        if r.status == 401:
            raise DrumsError(f"{where}: the host refused the token (401)")
        if full and (r.status in _FULL_STATUS or (r.status == 400 and _FULL.search(message))):
            reason = f"{where}: host full ({r.status} {message})"
            raise _Unreachable(Gate.HOST_REACHABLE, reason, full=True, wait_s=_wait_s(r.headers))
        if r.status == 404:  # the host no longer holds it (it restarted, or closed it)
            raise _Unreachable(Gate.SESSION_KNOWN, f"{where}: {message}")
        if r.status == 409:  # quarantined by the host, which says by which gates
            gates = body.get("failed_gates")
            try:
                gate = answer.names(gates, "failed_gates")[0] if gates else Gate.WORKER_ALIVE
            except ValueError as e:
                raise _malformed(where, e) from None
            raise _Unreachable(gate, f"{where}: {message}")
        if r.status == 422:
            raise ActionRejected(message)
        if r.status == 501:
            raise ForkUnsupported(message)
        if r.status == 429:
            raise _Unreachable(Gate.HOST_REACHABLE, f"{where}: host busy (429 {message})")
        if r.status >= 500:
            raise _Unreachable(Gate.HOST_REACHABLE, f"{where}: host error {r.status}")
        # 400 and 403 say the caller's own request is wrong (a bad task, faults the host refuses):
        # only create and fork carry what a caller chose; every other request the client built.
        if r.status in (400, 403) and (path == "/v1/envs" or path.endswith("/fork")):
            raise DrumsError(f"{where}: {r.status} {message}")
        if 300 <= r.status < 400:
            to = answer.line(r.headers.get("location", "?"), 80)
            reason = f"{where}: a redirect to {to}, not followed (the token goes to this host only)"
            raise _Unreachable(Gate.HOST_ANSWER, reason)
        raise _Unreachable(
            Gate.HOST_ANSWER, f"{where}: an answer the protocol has not: {r.status} {message}"
        )


class DrumsSession(Session):
    """One environment on a Drums host; invalid locally once the host stops answering."""

    def __init__(
        self,
        backend: DrumsBackend,
        env_id: str | None,
        observation: Observation,
        task_id: str | None,
        *,
        reason: str | None = None,
        timings: dict | None = None,
        parent: str | None = None,
    ):
        self.backend = backend
        self.env_id = env_id
        self.observation = observation
        self.task_id = task_id
        self.parent = parent
        self.timings = timings or {}
        self._reason = reason  # why the client gave up on this environment, if it did
        self.task_sha256: str | None = None  # the host's digest of the task it set up
        self._closed = env_id is None

    def __repr__(self) -> str:
        return f"DrumsSession(env_id={self.env_id!r}, generation={self.generation})"

    def step(self, action: Mapping, *, generation: int | None = None) -> Observation:
        action = check_action(action)
        if not self.observation.valid:
            return self.observation  # quarantined: no more steps
        gen = self.observation.generation if generation is None else generation
        where = f"/v1/envs/{self.env_id}/step"
        try:
            reply = self.backend._request("POST", where, json={"action": action, "generation": gen})
        except _Unreachable as e:
            self._give_up(e)
            return self.observation
        try:
            observation, timings = _observation(reply), answer.timings(reply)
        except ValueError as e:
            self._give_up(_malformed(f"POST {where}", e))
            return self.observation
        self.observation, self.timings = observation, timings
        return self.observation

    def observe(self) -> Observation:
        """The screen now, without acting (for a settle)."""
        if not self.observation.valid:
            return self.observation
        where = f"/v1/envs/{self.env_id}/screenshot"
        try:
            reply = self.backend._request("GET", where, idempotent=True)
        except _Unreachable as e:
            self._give_up(e)
            return self.observation
        try:
            observation = _observation(reply, done=self.observation.done)
        except ValueError as e:
            self._give_up(_malformed(f"GET {where}", e))
            return self.observation
        self.observation = observation
        return self.observation

    def fork(self, n: int, *, faults: list[Mapping] | None = None) -> list[DrumsSession]:
        """n children; `faults` (tests, reliability runs) arms each child's fault switches."""
        if not self.observation.valid:  # children of a quarantined parent are invalid too
            return [
                DrumsSession(
                    self.backend,
                    None,
                    self.observation,
                    self.task_id,
                    reason=self._reason,
                    parent=self.env_id,
                )
                for _ in range(n)
            ]
        where = f"/v1/envs/{self.env_id}/fork"
        try:
            reply = self.backend._request(
                "POST",
                where,
                json={"n": n, **({"faults": [dict(f) for f in faults]} if faults else {})},
                timeout=self.backend.create_timeout_s,
                wait_if_full=True,
            )
            listed, timings = reply.get("children"), answer.timings(reply)
            if not isinstance(listed, list) or len(listed) != n:
                got = len(listed) if isinstance(listed, list) else "no list"
                raise ValueError(f"children must be the {n} asked for, got {got}")
            ids = [c.get("env_id") if isinstance(c, dict) else None for c in listed]
            if len(set(map(str, ids))) != n or self.env_id in ids:
                raise ValueError("children's env_ids repeat, or name the parent")
        except ValueError as e:
            return self._dead_children(n, _malformed(f"POST {where}", e))
        except _Unreachable as e:
            return self._dead_children(n, e)
        children = []
        for child in listed:
            child_id = None
            try:
                child = answer.obj(child, "a child")
                child_id = answer.env_id(child.get("env_id"))
                # A child starts in the parent's state, so it shows the parent's screenshot.
                obs = _observation(child, done=False, screenshot=self.observation.screenshot)
                reason = None
            except ValueError as e:
                reason = _malformed(f"POST {where}", e).reason
                obs = _invalid(self.generation, Gate.HOST_ANSWER)
            children.append(
                DrumsSession(
                    self.backend,
                    child_id,  # an id that reads closes with the child, valid or not
                    obs,
                    self.task_id,
                    reason=reason,
                    timings=timings,
                    parent=self.env_id,
                )
            )
        return children

    def _dead_children(self, n: int, e: _Unreachable) -> list[DrumsSession]:
        log.warning("fork %s: %s", self.env_id, e.reason)
        dead = _invalid(self.generation, e.gate)
        return [
            DrumsSession(
                self.backend, None, dead, self.task_id, reason=e.reason, parent=self.env_id
            )
            for _ in range(n)
        ]

    def verify(self) -> Verification:
        if self.env_id is None or self._reason is not None:
            gates = self.observation.failed_gates or [Gate.HOST_REACHABLE]
            return Verification.invalid(
                gates, env_id=self.env_id, **_why(gates, self._reason), trusted=False
            )
        where = f"/v1/envs/{self.env_id}/verify"
        try:
            reply = self.backend._request("POST", where, idempotent=True)
            return Verification.from_dict(answer.verification(reply))
        except ValueError as e:
            failure = _malformed(f"POST {where}", e)
        except _Unreachable as e:
            failure = e
        self._give_up(failure)
        gates = [failure.gate]
        return Verification.invalid(
            gates, env_id=self.env_id, **_why(gates, failure.reason), trusted=False
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.backend._request("DELETE", f"/v1/envs/{self.env_id}", idempotent=True)
        except (_Unreachable, DrumsError) as e:
            log.warning("close %s: %s", self.env_id, getattr(e, "reason", e))

    def _give_up(self, e: _Unreachable) -> None:
        log.warning("environment %s: %s", self.env_id, e.reason)
        self._reason = e.reason
        if self.observation.valid:
            self.observation = _invalid(self.observation.generation, e.gate)
