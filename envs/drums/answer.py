"""What a Drums host's answer must look like before the client believes any of it.

A host may be hostile, buggy, or behind a proxy that rewrites it, so every field the client reads
is checked here for its JSON type and range: a bool is a JSON bool (never "false" or 1), a score
is exactly 0 or 1, a generation a non-negative integer, an environment id a short plain name, a
screenshot a PNG of a sane size. Each check raises `ValueError` with one line saying what was
wrong; the client turns it into an invalid attempt under gate `host_answer`
(`envs/drums/client.py`), so a malformed answer is never a crash and never a value that means
something else (garbage base64 read as the policy's refused action, "false" read as true).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from PIL import Image

from envab.envs.protocol import reported

MAX_RESPONSE_BYTES = 32 * 2**20  # one answer, as read off the wire (no compression: identity)
MAX_SCREENSHOT_B64 = 16 * 2**20  # a screenshot's base64 text
MAX_SCREEN_SIDE = 4096  # pixels, each way; far below Pillow's decompression-bomb limit
MAX_GENERATION = 10**9  # an action count; anything larger is not a real episode
MAX_NAMES = 64  # failed gates or audit flags in one answer
LINE = 200  # characters of what a host said kept in a reason, a log line or an audit

# An environment id goes into the URL path of every later request: a plain name, so that an id
# like "../health" or "x?y" cannot point the client's token at another route.
_ENV_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Verdicts, gates and audit flags end up in drop reasons (`drums_invalid:<verdict>:<gates>`).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_PNG = b"\x89PNG\r\n\x1a\n"
_REQUIRED = object()


def line(text: Any, limit: int = LINE) -> str:
    """`text` as one printable line of at most `limit` characters (what a host said, fit for a
    log, an exception message or an audit)."""
    flat = " ".join(str(text).split())
    flat = "".join(c if c.isprintable() else "?" for c in flat)
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _show(value: Any) -> str:
    return line(repr(value), 60)


def parse(content: bytes) -> Any:
    """JSON as the standard allows it: no NaN or Infinity (nor a number too large for a float),
    valid UTF-8; a nesting too deep to parse is malformed, not a crash."""
    try:
        return json.loads(content.decode("utf-8"), parse_constant=_no_constant, parse_float=_real)
    except RecursionError:
        raise ValueError("the answer nests too deep to be JSON the protocol has") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"the answer is not JSON: {line(e, 80)}") from None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _real(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{line(text, 20)} does not fit a float")
    return value


def obj(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is {_kind(value)}, not a JSON object")
    return value


def _kind(value: Any) -> str:
    names = {bool: "a bool", int: "a number", float: "a number", str: "a string", list: "a list"}
    return "null" if value is None else names.get(type(value), "an object")


def flag(body: Mapping, key: str, default: Any = _REQUIRED) -> bool:
    """A JSON bool; `default` when the key is missing (where the protocol lets it be)."""
    if key not in body and default is not _REQUIRED:
        return default
    value = body.get(key)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be a JSON bool, got {_show(value)}")
    return value


def generation(body: Mapping) -> int:
    value = body.get("generation")
    if type(value) is not int or not 0 <= value <= MAX_GENERATION:
        raise ValueError(f"generation must be an integer in [0, 1e9], got {_show(value)}")
    return value


def env_id(value: Any) -> str:
    if not isinstance(value, str) or not _ENV_ID.fullmatch(value):
        raise ValueError(f"env_id must be a plain name of <= 128 characters, got {_show(value)}")
    return value


def name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(f"{what} must be a plain name of <= 64 characters, got {_show(value)}")
    return value


def names(value: Any, what: str) -> tuple[str, ...]:
    """A list of plain names; missing or null is none."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_NAMES:
        raise ValueError(f"{what} must be a list of at most {MAX_NAMES} names, got {_show(value)}")
    return tuple(name(v, what) for v in value)


def verdict(body: Mapping) -> tuple[bool, str, tuple[str, ...]]:
    """(valid, verdict, failed_gates) exactly as typed; `protocol.reported` then reads them."""
    return (
        flag(body, "valid"),
        name(body.get("verdict"), "verdict"),
        names(body.get("failed_gates"), "failed_gates"),
    )


def digest(body: Mapping, key: str) -> str | None:
    """A state or task digest: a short printable string, or absent."""
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 128 or not value.isprintable():
        raise ValueError(f"{key} must be a string of at most 128 characters, got {_show(value)}")
    return value


def timings(body: Mapping) -> dict:
    value = body.get("timings")
    return {} if value is None else obj(value, "timings")


def screenshot(value: Any) -> Image.Image:
    """A base64 PNG of at most MAX_SCREEN_SIDE pixels each way, decoded to RGB. The size is read
    from the header before any pixel is decoded, so a decompression bomb is refused unread."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"screenshot_png must be a base64 PNG, got {_show(value)}")
    if len(value) > MAX_SCREENSHOT_B64:
        raise ValueError(f"screenshot_png is {len(value)} characters, over {MAX_SCREENSHOT_B64}")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("screenshot_png is not valid base64") from None
    if not data.startswith(_PNG):
        raise ValueError("screenshot_png is not a PNG")
    try:
        with Image.open(io.BytesIO(data), formats=["PNG"]) as image:
            width, height = image.size
            sane = 0 < width <= MAX_SCREEN_SIDE and 0 < height <= MAX_SCREEN_SIDE
            if sane:
                image.verify()  # chunk checksums; a verified image must be opened again to decode
        if sane:
            with Image.open(io.BytesIO(data), formats=["PNG"]) as image:
                rgb = image.convert("RGB")
    except Exception as e:  # Pillow raises many kinds (OSError, SyntaxError, bomb errors, zlib)
        raise ValueError(f"screenshot_png does not decode: {type(e).__name__}") from None
    if not sane:
        raise ValueError(f"screenshot_png is {width}x{height}, over {MAX_SCREEN_SIDE} a side")
    return rgb


def score(value: Any) -> float | None:
    """A score as sent: a finite number, or absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"score must be a number, got {_show(value)}")
    return float(value)


def verification(body: Any) -> dict:
    """verify's answer, checked and ready for `Verification.from_dict`. The score of a valid
    verdict is exactly 0 or 1; a fraction in [0, 1] only where the audit registers
    `partial_credit: true`, and then it becomes 1 or 0 with the fraction kept as
    `audit.partial_score`: the rule `protocol.checked` applies to a checker on this side."""
    body = obj(body, "verify's answer")
    valid, said, gates = verdict(body)
    audit = dict(obj(body["audit"], "audit")) if body.get("audit") is not None else {}
    if audit.get("trusted") is not None:
        flag(audit, "trusted")
    for key in ("audit_flags", "flags"):
        names(audit.get(key), f"audit.{key}")
    partial = flag(audit, "partial_credit", default=False)
    if audit.get("partial_score") is not None:
        kept = score(audit["partial_score"])
        if not 0.0 <= kept <= 1.0:
            raise ValueError(f"audit.partial_score must be in [0, 1], got {_show(kept)}")
    value = score(body.get("score"))
    if reported(valid, said, gates)[0]:  # a score the trainer would use
        if value is None:
            raise ValueError("a valid verdict without a score")
        if value not in (0.0, 1.0):
            if not (partial and 0.0 <= value <= 1.0):
                raise ValueError(
                    f"score {_show(body.get('score'))} on a valid verdict: 0 or 1 (a fraction only "
                    "where the audit registers partial_credit)"
                )
            audit["partial_score"] = value
            value = 0.0
    return {
        "score": value,
        "valid": valid,
        "verdict": said,
        "failed_gates": list(gates),
        "audit": audit,
    }
