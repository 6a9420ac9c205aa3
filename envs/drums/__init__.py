"""The Drums client: the session protocol (`envab.envs.protocol`) over HTTP to a drumsd-like host.

Exercised against the embedded host (`envab.envs.host`) only; it has never been run against a real
drumsd. The wire format it speaks is the one documented in `envab.envs.host`.
"""

from envab.envs.auth import read_token
from envab.envs.drums.client import DrumsBackend, DrumsError, DrumsSession
from envab.envs.drums.connect import EMBEDDED, connect
from envab.envs.protocol import ActionRejected

__all__ = [
    "EMBEDDED",
    "ActionRejected",
    "DrumsBackend",
    "DrumsError",
    "DrumsSession",
    "connect",
    "read_token",
]
