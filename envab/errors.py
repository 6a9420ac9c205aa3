"""What a refusal is, and how an entry point reports one.

A `Refusal` is bad input or a missing prerequisite, refused with one clear line saying what is
wrong and where (`config.yaml: arms.drums.mode: 'forkk' is not one of ['fork', 'restore']`); an
entry point prints it and exits with its refusal code (2 unless the command documents another).
Each refusal class keeps the builtin base it had (`ConfigError` is still a `ValueError`), so code
that catches the builtin still does. A runtime failure (a VM that died, a closed channel, a failed
gate) is not a refusal: tests/test_errors.py lists each such class with its reason, so a new
exception class must choose.
"""

from __future__ import annotations

import sys


class Refusal(Exception):
    """Bad input, refused with one clear line saying what is wrong and where; an entry point
    prints it and exits 2."""


def refused(error: BaseException, console=None, *, prefix: str = "error", code: int = 2) -> int:
    """Report `error` as an entry point does, and return the exit code for `main` to return: one
    line `<prefix>: <error>` on stderr, and `error: <error>` on the job's console where it has
    one (envab/progress.py)."""
    print(f"{prefix}: {error}", file=sys.stderr)
    if console is not None:
        console.say(f"error: {error}")
    return code
