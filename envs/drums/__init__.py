"""The Drums client: the session protocol (`envs.protocol`) over HTTP to a drumsd-like host.

Exercised against the embedded host (`envs.host`) only; it has never been run against a real
drumsd. The wire format it speaks is the one documented in `envs.host`.
"""

from envs.drums.client import ActionRejected, DrumsBackend, DrumsError, DrumsSession, read_token

__all__ = ["ActionRejected", "DrumsBackend", "DrumsError", "DrumsSession", "read_token"]
