"""The HTTP face of the host: FastAPI routes over a `Pool`, behind a bearer token.

The protocol itself is documented in `envab.envs.host` (the package docstring).
"""

from __future__ import annotations

import hmac
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Body, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from envab.envs.host.pool import (
    BadRequest,
    FaultsDisabled,
    HostConfig,
    Pool,
    Quarantined,
    UnknownEnvironment,
)
from envab.envs.protocol import ActionRejected, ForkUnsupported

API = "/v1"

_ERRORS: list[tuple[type[Exception], int]] = [
    (BadRequest, 400),
    (UnknownEnvironment, 404),
    (FaultsDisabled, 403),
    (Quarantined, 409),
    (ActionRejected, 422),
    (ForkUnsupported, 501),
]


def _error(status: int, message: str, failed_gates: list[str] | None = None) -> JSONResponse:
    body = {"error": message}
    if failed_gates:  # a quarantine says which gate failed, so the client's verdict can too
        body["failed_gates"] = [str(g) for g in failed_gates]
    return JSONResponse(body, status_code=status)


def build_app(config: HostConfig, token: str) -> FastAPI:
    if not token:
        raise ValueError("the host needs a non-empty token")
    expected = f"Bearer {token}".encode()
    pool = Pool(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await run_in_threadpool(pool.start)
        yield
        await run_in_threadpool(pool.stop)

    app = FastAPI(
        title="env-ab embedded host",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.pool = pool

    app.add_middleware(RequireToken, expected=expected)

    for exc_type, status in _ERRORS:
        app.add_exception_handler(
            exc_type,
            lambda _req, e, status=status: _error(
                status, _message(e), getattr(e, "failed_gates", None)
            ),
        )

    @app.exception_handler(RequestValidationError)
    async def malformed(_request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(400, f"{where}: {first.get('msg', 'malformed request')}")

    @app.get(f"{API}/health")
    def health() -> dict:
        return {
            "status": "ok",
            "mode": config.mode,
            "can_fork": config.mode == "fork",
            "environments": len(pool),
            "zygote_pid": pool.zygote_pid,
            "sandbox": pool.config.sandbox,
            "allow_faults": config.allow_faults,
        }

    @app.post(f"{API}/envs", status_code=201)
    def create(
        task: Annotated[dict | None, Body(embed=True)] = None,
        task_id: Annotated[str | None, Body(embed=True)] = None,
        faults: Annotated[dict | None, Body(embed=True)] = None,
    ) -> dict:
        return pool.create(pool.task_for(task, task_id), faults)

    @app.post(f"{API}/envs/{{env_id}}/fork")
    def fork(
        env_id: str,
        n: Annotated[int, Body(embed=True)],
        faults: Annotated[Any, Body(embed=True)] = None,
    ) -> dict:
        return pool.fork(env_id, n, faults)

    @app.get(f"{API}/envs/{{env_id}}/screenshot")
    def observe(env_id: str) -> dict:
        return pool.observe(env_id)

    @app.post(f"{API}/envs/{{env_id}}/step")
    def step(
        env_id: str,
        action: Annotated[dict, Body(embed=True)],
        generation: Annotated[Any, Body(embed=True)],
    ) -> dict:
        return pool.step(env_id, action, generation)

    @app.post(f"{API}/envs/{{env_id}}/verify")
    def verify(env_id: str) -> dict:
        return pool.verify(env_id)

    @app.delete(f"{API}/envs/{{env_id}}")
    def close(env_id: str) -> dict:
        return pool.close(env_id)

    return app


class RequireToken:
    """Pure ASGI middleware (cheaper than BaseHTTPMiddleware): 401 unless the token matches."""

    def __init__(self, app, expected: bytes):
        self.app = app
        self.expected = expected

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                refuse = JSONResponse(
                    {"error": "missing or wrong bearer token"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                await refuse(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _message(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"no environment {e.args[0]!r}"
    return str(e).splitlines()[0] if str(e) else type(e).__name__
