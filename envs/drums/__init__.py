"""The Drums client: the session protocol (`envs.protocol`) over HTTP to a drumsd-like host.

Exercised against the embedded host (`envs.host`) only; it has never been run against a real
drumsd. The wire format it speaks is the one documented in `envs.host`.
"""

from envs.drums.client import ActionRejected, DrumsBackend, DrumsError, DrumsSession, read_token
from envs.drums.connect import EMBEDDED, connect

__all__ = ["EMBEDDED", "ActionRejected", "DrumsBackend", "DrumsError", "DrumsSession", "connect",
           "read_token"]
