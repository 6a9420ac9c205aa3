"""vLLM in server mode: the training job starts `trl vllm-serve` on the model it checked, waits
until the server answers its health check, and stops it when training ends, whichever way it
ends. The server is a child of the job (envs/lifetime.py): it dies with it, never left holding a
GPU. Its output goes to its own log beside the job's. A run of several training processes shares
one server: rank 0 starts and stops it, the others wait until it answers (TRL's main process then
generates for all of them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from envab.envs.lifetime import start_child
from envab.schema import ConfigError
from envab.trainer.compute import Compute, vllm_serve_command

HEALTH = "/health/"  # trl vllm-serve's health route (TRL's VLLMClient polls the same)


class ServerError(ConfigError):
    """The vLLM server did not come up (the message says why and where its log is)."""


def healthy(base_url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(base_url + HEALTH, timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(
    process: subprocess.Popen | None, base_url: str, timeout_s: float, log: Path
) -> float:
    """Seconds until the server answers; refuses at once if it exits (when this process started
    it), or after `timeout_s`."""
    started = time.monotonic()
    while not healthy(base_url):
        if process is not None and process.poll() is not None:
            raise ServerError(
                f"the vLLM server exited with status {process.returncode} before it was healthy "
                f"(its log: {log})"
            )
        if time.monotonic() - started > timeout_s:
            raise ServerError(
                f"the vLLM server at {base_url} was not healthy after {timeout_s:.0f} s "
                f"(training.compute.vllm.startup_timeout_s; its log: {log})"
            )
        time.sleep(0.5)
    return time.monotonic() - started


def stop(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`: the GPU memory is given back before the job ends."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def served(
    compute: Compute,
    model_dir: str | Path,
    log: str | Path,
    command: list[str] | None = None,
    starts: bool = True,
) -> Iterator[dict]:
    """The vLLM server of a server-mode run, healthy inside the block and stopped after; yields
    what the run records about it. Nothing to do for any other mode. `starts`: False for the
    training processes other than rank 0, which wait for rank 0's server and leave it alone.
    `command` replaces `trl vllm-serve ...` (tests serve the health route from a stand-in)."""
    if compute.vllm is None or compute.vllm.mode != "server":
        yield {}
        return
    vllm = compute.vllm
    if not starts:
        startup_s = wait_healthy(None, vllm.base_url, vllm.startup_timeout_s, Path(log))
        yield {"base_url": vllm.base_url, "waited_s": startup_s, "started_by": "rank 0"}
        return
    if healthy(vllm.base_url):
        raise ServerError(
            f"something already answers at {vllm.base_url}: another run's vLLM server? "
            "(training.compute.vllm.port)"
        )
    command = command or vllm_serve_command(compute, str(model_dir))
    env = dict(os.environ)
    if vllm.server_gpus:
        env["CUDA_VISIBLE_DEVICES"] = vllm.server_gpus
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        process = start_child(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        startup_s = wait_healthy(process, vllm.base_url, vllm.startup_timeout_s, log)
        yield {"base_url": vllm.base_url, "startup_s": startup_s, "log": log.as_posix()}
    finally:
        stop(process)
