"""Open the backend an arm names: a Drums host by URL, or the embedded host (`url: embedded`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from envab.envs import scratch
from envab.envs.drums.client import DrumsBackend

EMBEDDED = "embedded"


@contextmanager
def connect(
    url: str,
    *,
    mode: str | None = None,
    sandbox: str = "gvisor",
    host_args: list[str] | tuple[str, ...] = (),
    token_file: str | Path | None = None,
    log_path: str | Path | None = None,
    allow_faults: bool = False,
    **client,
) -> Iterator[DrumsBackend]:
    """A DrumsBackend for `url`; for "embedded", start the host in `mode` for the block's length,
    each environment in a `sandbox` ("gvisor" or "process"), with any other host flags in
    `host_args` (the X desktop's `--world xdesktop --rootfs DIR`).

    An embedded host without a token file gets a fresh random token for its lifetime; with
    `allow_faults` its fault-injection switches are on (tests, reliability runs). For a real host
    the token comes from `token_file`, DRUMS_TOKEN_FILE or DRUMS_TOKEN, and faults are refused.
    """
    with ExitStack() as stack:
        if url == EMBEDDED:
            # Only here: a client of a real drumsd never loads the host (FastAPI, uvicorn).
            from envab.envs.host import serve_embedded, write_token_file

            if mode is None:
                raise ValueError("an embedded arm needs a mode (restore or fork)")
            if token_file is None:
                # A killed job's token (dead with its host) is swept by the next one's.
                tmp = scratch.make("envab-token-")
                stack.callback(shutil.rmtree, tmp, ignore_errors=True)
                token_file = write_token_file(tmp / "token")
            url = stack.enter_context(
                serve_embedded(
                    mode,
                    token_file,
                    log_path=log_path,
                    allow_faults=allow_faults,
                    sandbox=sandbox,
                    extra_args=list(host_args),
                )
            )
        elif allow_faults:
            raise ValueError("fault injection needs the embedded host (url: embedded)")
        backend = stack.enter_context(DrumsBackend(url, token_file=token_file, **client))
        yield backend
