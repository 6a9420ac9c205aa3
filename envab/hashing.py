"""sha256 digests of bytes, files, folders and canonical JSON."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

_CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def canonical_json(obj) -> bytes:
    """The one serialisation that digests of JSON objects are taken over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_json(obj) -> str:
    return sha256_bytes(canonical_json(obj))


def file_manifest(root: str | Path) -> dict[str, str]:
    """Relative POSIX path -> sha256 for every regular file under `root`, sorted by path."""
    root = Path(root)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in files}


def aggregate_digest(manifest: dict[str, str]) -> str:
    """One digest over a path -> sha256 manifest (order-independent, path-sensitive)."""
    return sha256_json(dict(sorted(manifest.items())))
