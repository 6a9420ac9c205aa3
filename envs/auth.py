"""The Drums bearer token, read the same way by the client and by the embedded host.

It lives in request headers only: never logged, put in a repr or in an exception message.
"""

from __future__ import annotations

import os
from pathlib import Path


class TokenError(RuntimeError):
    """No usable token: the file is missing or empty, or nothing names one (one line)."""


def read_token(token: str | None = None, token_file: str | Path | None = None) -> str:
    """The bearer token: argument, then token_file, then DRUMS_TOKEN_FILE, then DRUMS_TOKEN
    (surrounding whitespace dropped)."""
    if token:
        return token
    path = token_file or os.environ.get("DRUMS_TOKEN_FILE")
    if path:
        try:
            value = Path(path).read_text().strip()
        except OSError as e:
            raise TokenError(f"token file {path}: {e.strerror}") from None
        if not value:
            raise TokenError(f"token file {path} is empty")
        return value
    value = os.environ.get("DRUMS_TOKEN", "").strip()
    if not value:
        raise TokenError("no Drums token: set DRUMS_TOKEN_FILE or DRUMS_TOKEN")
    return value
