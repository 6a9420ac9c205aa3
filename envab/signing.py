"""Signed receipts: a DSSE envelope beside each receipt, so that rewriting a receipt and
recomputing its digests (which `statement_sha256` cannot catch) is caught by its signature.

    python -m envab.signing keygen --private team.key --public team.pub   # once, off the node
    ENVAB_SIGNING_KEY=team.key snakemake --cores all                      # receipts get .sig
    python -m envab.verify receipts/<exp> --public-key team.pub           # checks signatures

The envelope (`<receipt>.sig`) is DSSE's: the statement as its payload, signed with Ed25519 over
DSSE's pre-authentication encoding, with the key's id (the sha256 of its public key). The private
key is read from the file `ENVAB_SIGNING_KEY` names when a receipt is written and is never
written anywhere else (no log, receipt, trace or wandb run holds it or its path); a team keeps it
off the compute node where it can, and passes a reviewer only the public key.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from envab.errors import Refusal, refused
from envab.io import atomic_write_json

KEY_ENV = "ENVAB_SIGNING_KEY"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
SUFFIX = ".sig"


class SigningKeyError(Refusal):
    """The signing or verifying key cannot be read (the message names the file, never its bytes)."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed, so a payload cannot pass as another
    type."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def payload(statement: dict) -> bytes:
    return json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(public: Ed25519PublicKey) -> str:
    return hashlib.sha256(_raw(public)).hexdigest()


def load_private(path: str | Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise SigningKeyError(
            f"{KEY_ENV}: cannot read an Ed25519 key ({type(e).__name__})"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{KEY_ENV}: the key is not an Ed25519 key")
    return key


def load_public(path: str | Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError, TypeError) as e:
        raise SigningKeyError(f"{path}: not an Ed25519 public key ({type(e).__name__})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"{path}: not an Ed25519 public key")
    return key


def envelope(statement: dict, key: Ed25519PrivateKey) -> dict:
    body = payload(statement)
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(body).decode("ascii"),
        "signatures": [
            {
                "keyid": key_id(key.public_key()),
                "sig": base64.b64encode(key.sign(pae(PAYLOAD_TYPE, body))).decode("ascii"),
            }
        ],
    }


def sign_if_configured(receipt: str | Path, statement: dict) -> bool:
    """Write `<receipt>.sig` when `ENVAB_SIGNING_KEY` names a key; whether it did."""
    path = os.environ.get(KEY_ENV)
    if not path:
        return False
    atomic_write_json(f"{receipt}{SUFFIX}", envelope(statement, load_private(path)))
    return True


def check_configured() -> None:
    """Refuse now, not when its receipt is written hours later, a job whose `ENVAB_SIGNING_KEY`
    names no readable Ed25519 key (a training job writes its receipt at its end)."""
    path = os.environ.get(KEY_ENV)
    if path:
        load_private(path)


def check(receipt: str | Path, statement: dict, public: Ed25519PublicKey) -> str:
    """ "ok", or what is wrong: UNSIGNED (no envelope), MALFORMED, WRONG KEY, BAD SIGNATURE (the
    envelope's signature does not hold), NOT THIS RECEIPT (a valid envelope of another
    statement)."""
    path = Path(f"{receipt}{SUFFIX}")
    if not path.is_file():
        return "UNSIGNED"
    try:
        env = json.loads(path.read_text())
        body = base64.b64decode(env["payload"], validate=True)
        signatures = [s for s in env["signatures"] if s["keyid"] == key_id(public)]
        kind = env["payloadType"]
    except (OSError, ValueError, KeyError, TypeError):
        return "MALFORMED"
    if not signatures:
        return "WRONG KEY"
    try:
        public.verify(base64.b64decode(signatures[0]["sig"], validate=True), pae(kind, body))
    except (InvalidSignature, ValueError, TypeError):
        return "BAD SIGNATURE"
    if kind != PAYLOAD_TYPE or body != payload(statement):
        return "NOT THIS RECEIPT"
    return "ok"


def keygen(private: Path, public: Path) -> None:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never over another key
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m envab.signing", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("keygen", help="a new Ed25519 key pair")
    gen.add_argument("--private", type=Path, required=True)
    gen.add_argument("--public", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        keygen(args.private, args.public)
    except FileExistsError:
        return refused(Refusal(f"{args.private} exists: a key is never overwritten"))
    print(f"keygen: {args.private} (keep it off the compute node), {args.public} (for reviewers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
