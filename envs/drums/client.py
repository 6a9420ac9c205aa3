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
"""

from __future__ import annotations

import base64
import io
import logging
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
from PIL import Image

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

_RETRY_STATUS = frozenset({502, 503, 504})


class DrumsError(RuntimeError):
    """The host refused a request that is wrong in itself (auth, bad task, unknown route)."""


class _Unreachable(Exception):
    """Internal: the host did not answer (or answered 5xx); carries the gate to fail."""

    def __init__(self, gate: str, reason: str):
        super().__init__(reason)
        self.gate = gate
        self.reason = reason


def _image(b64: str | None) -> Image.Image | None:
    if b64 is None:
        return None
    with Image.open(io.BytesIO(base64.b64decode(b64))) as image:
        return image.convert("RGB")


def _observation(body: Mapping, screenshot: Image.Image | None, done: bool = False) -> Observation:
    """The host's observation; a verdict or gate this client has never seen is kept by name and
    read as an environment failure (protocol.reported), never a crash."""
    valid, verdict, gates = reported(body["valid"], body["verdict"], body.get("failed_gates"))
    return Observation(
        generation=int(body["generation"]),
        screenshot=screenshot if valid else None,
        valid=valid,
        verdict=verdict,
        failed_gates=gates,
        done=done,
        state_sha256=body.get("state_sha256"),
    )


def _invalid(generation: int, gate: str) -> Observation:
    return Observation(generation, None, False, str(verdict_for([gate])), (str(gate),))


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
        max_connections: int = 64,
        transport: httpx.BaseTransport | None = None,
    ):
        self.url = url.rstrip("/")
        self.step_timeout_s = step_timeout_s
        self.create_timeout_s = create_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        try:
            authorization = f"Bearer {read_token(token, token_file)}"
        except TokenError as e:  # no token is a request wrong in itself, as it always was here
            raise DrumsError(str(e)) from None
        # Nagle's algorithm plus delayed ACKs would add ~40 ms to every small POST.
        transport = transport or httpx.HTTPTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )
        self._http = httpx.Client(
            base_url=self.url,
            transport=transport,
            headers={"Authorization": authorization},
            timeout=httpx.Timeout(step_timeout_s, connect=connect_timeout_s),
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
        if self._can_fork is None:
            self._can_fork = bool(self.health().get("can_fork"))
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
            reply = self._request("POST", "/v1/envs", json=body, timeout=self.create_timeout_s)
        except _Unreachable as e:
            log.warning("create %s: %s", task_id, e.reason)
            return DrumsSession(self, None, _invalid(0, e.gate), task_id, reason=e.reason)
        obs = _observation(reply, _image(reply.get("screenshot_png")))
        session = DrumsSession(self, reply["env_id"], obs, task_id, timings=reply["timings"])
        session.task_sha256 = reply.get("task_sha256")
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
    ) -> dict:
        """One call; retried on a refused connection, and on any failure when idempotent."""
        attempts = 1 + self.retries
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                r = self._http.request(
                    method, path, json=json, timeout=timeout or self.step_timeout_s
                )
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
                if r.status_code in _RETRY_STATUS and idempotent and not last:
                    pass
                else:
                    return self._decode(r, method, path)
            time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    @staticmethod
    def _decode(r: httpx.Response, method: str, path: str) -> dict:
        try:
            body = r.json()
        except ValueError:
            body = {}
        message = body.get("error", r.reason_phrase) if isinstance(body, dict) else r.reason_phrase
        if r.status_code < 300:
            return body
        where = f"{method} {path}"
        if r.status_code == 401:
            raise DrumsError(f"{where}: the host refused the token (401)")
        if r.status_code == 404:  # the host no longer holds it (it restarted, or closed it)
            raise _Unreachable(Gate.SESSION_KNOWN, f"{where}: {message}")
        if r.status_code == 409:  # quarantined by the host, which says by which gates
            gates = body.get("failed_gates") if isinstance(body, dict) else None
            gate = str(gates[0]) if isinstance(gates, list) and gates else Gate.WORKER_ALIVE
            raise _Unreachable(gate, f"{where}: {message}")
        if r.status_code == 422:
            raise ActionRejected(message)
        if r.status_code == 501:
            raise ForkUnsupported(message)
        if r.status_code >= 500:
            raise _Unreachable(Gate.HOST_REACHABLE, f"{where}: host error {r.status_code}")
        raise DrumsError(f"{where}: {r.status_code} {message}")


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
        try:
            reply = self.backend._request(
                "POST", f"/v1/envs/{self.env_id}/step", json={"action": action, "generation": gen}
            )
        except _Unreachable as e:
            self._give_up(e)
            return self.observation
        screenshot = _image(reply.get("screenshot_png"))
        self.observation = _observation(reply, screenshot, bool(reply.get("done")))
        self.timings = reply.get("timings", {})
        return self.observation

    def observe(self) -> Observation:
        """The screen now, without acting (for a settle)."""
        if not self.observation.valid:
            return self.observation
        try:
            reply = self.backend._request(
                "GET", f"/v1/envs/{self.env_id}/screenshot", idempotent=True
            )
        except _Unreachable as e:
            self._give_up(e)
            return self.observation
        screenshot = _image(reply.get("screenshot_png"))
        self.observation = _observation(reply, screenshot, self.observation.done)
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
        try:
            reply = self.backend._request(
                "POST",
                f"/v1/envs/{self.env_id}/fork",
                json={"n": n, **({"faults": [dict(f) for f in faults]} if faults else {})},
                timeout=self.backend.create_timeout_s,
            )
        except _Unreachable as e:
            log.warning("fork %s: %s", self.env_id, e.reason)
            dead = _invalid(self.generation, e.gate)
            return [
                DrumsSession(
                    self.backend, None, dead, self.task_id, reason=e.reason, parent=self.env_id
                )
                for _ in range(n)
            ]
        children = []
        for child in reply["children"]:
            # A child starts in the parent's state, so it shows the parent's screenshot.
            screenshot = self.observation.screenshot if child["valid"] else None
            children.append(
                DrumsSession(
                    self.backend,
                    child["env_id"],
                    _observation(child, screenshot),
                    self.task_id,
                    timings=reply["timings"],
                    parent=self.env_id,
                )
            )
        return children

    def verify(self) -> Verification:
        if self.env_id is None or self._reason is not None:
            return Verification.invalid(
                self.observation.failed_gates or [Gate.HOST_REACHABLE],
                env_id=self.env_id,
                error=self._reason,
                trusted=False,
            )
        try:
            reply = self.backend._request("POST", f"/v1/envs/{self.env_id}/verify", idempotent=True)
        except _Unreachable as e:
            self._give_up(e)
            return Verification.invalid([e.gate], env_id=self.env_id, error=e.reason, trusted=False)
        return Verification.from_dict(reply)

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
