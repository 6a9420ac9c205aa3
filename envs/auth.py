"""The Drums bearer token, read the same way by the client and by the embedded host.

It lives in request headers only: never logged, put in a repr or in an exception message.
"""

from __future__ import annotations

import os
from pathlib import Path

from envab.errors import Refusal

DEFAULT_TOKEN_FILE = "/etc/drums/token"  # where a drumsd host keeps its token (drums-verifiers)


class TokenError(Refusal, RuntimeError):
    """No usable token: the file is missing or empty, or nothing names one (one line)."""


def read_token(token: str | None = None, token_file: str | Path | None = None) -> str:
    """The bearer token: argument, then token_file, then DRUMS_TOKEN_FILE, then DRUMS_TOKEN, then
    the host's default file /etc/drums/token when it exists (surrounding whitespace dropped)."""
    if token:
        return token
    path = token_file or os.environ.get("DRUMS_TOKEN_FILE")
    if path:
        return _from_file(path)
    value = os.environ.get("DRUMS_TOKEN", "").strip()
    if value:
        return value
    if Path(DEFAULT_TOKEN_FILE).exists():
        return _from_file(DEFAULT_TOKEN_FILE)
    raise TokenError(
        f"no Drums token: set DRUMS_TOKEN_FILE or DRUMS_TOKEN, or put it in {DEFAULT_TOKEN_FILE}"
    )


def _from_file(path: str | Path) -> str:
    try:
        value = Path(path).read_text().strip()
    except OSError as e:
        raise TokenError(f"token file {path}: {e.strerror}") from None
    if not value:
        raise TokenError(f"token file {path} is empty")
    return value
