"""Sealing the control traffic of a run across machines with its per-run token.

A c10d ``TCPStore`` has no access control: any process that reaches its port can list, read
and write every key. Across machines the controller's stores listen where other nodes reach
them, so every control message there (registrations, world requests, hellos, tasks, results,
death reports) is sealed with the run's token: Fernet (AES-CBC with an HMAC-SHA256 tag) gives
secrecy and authenticity, so a process without the token can neither read a result nor
forge a task, a result or a registration. Each message is sealed for the key it is stored
under, so a sealed value copied to another key (an old result replayed as a new one) does not
open there. A run on one machine keeps its plain JSON (``PLAIN``): its worlds are the
controller's own children, as they always were.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import functools
import hashlib
import secrets
import socket
from typing import Any

ENV_TOKEN = "CONFORMANCE_TOKEN"  # the run's token, handed to join agents and to ranks


class WrongToken(ValueError):
    """A value that was not sealed with this run's token for this key."""


def new_token() -> str:
    """A fresh token: 256 random bits, safe to paste into a shell."""
    return secrets.token_urlsafe(32)


@dataclasses.dataclass(frozen=True)
class Seal:
    """Seals and opens control messages; ``token`` None: plain text (one machine)."""

    token: str | None = None

    @property
    def sealed(self) -> bool:
        return self.token is not None

    @functools.cached_property
    def _fernet(self) -> Any:
        from cryptography.fernet import Fernet

        assert self.token is not None
        # any string may be a token; Fernet wants 32 bytes, so they are hashed from it
        digest = hashlib.sha256(b"conformance control channel\0" + self.token.encode()).digest()
        return Fernet(base64.urlsafe_b64encode(digest))

    def close(self, key: str, text: str) -> str | bytes:
        """``text`` as it is stored under ``key``."""
        if self.token is None:
            return text
        return self._fernet.encrypt(f"{key}\n{text}".encode())

    def open(self, key: str, raw: bytes) -> str:
        """The text stored under ``key``; ``WrongToken`` where it was not sealed for it."""
        if self.token is None:
            return raw.decode()
        from cryptography.fernet import InvalidToken

        try:
            plain = self._fernet.decrypt(raw).decode()
        except InvalidToken:
            raise WrongToken(f"{key!r} is not sealed with this run's token") from None
        sealed_for, _, text = plain.partition("\n")
        if sealed_for != key:
            raise WrongToken(f"{key!r} holds a message sealed for {sealed_for!r}")
        return text


PLAIN = Seal()


@dataclasses.dataclass(frozen=True)
class Channel:
    """A store seen through a seal: what the parties of a world or a run say to each other."""

    store: Any  # torch.distributed.Store
    seal: Seal = PLAIN

    def set(self, key: str, text: str) -> None:
        self.store.set(key, self.seal.close(key, text))

    def get(self, key: str) -> str:
        return self.seal.open(key, self.store.get(key))


def control_store(host: str, loopback_only: bool) -> Any:
    """The world's control store. A ``TCPStore`` master listens on every interface, and its
    plain control traffic names the functions ranks run; on one machine it is handed a socket
    bound to the loopback interface instead, so nothing off this machine can reach it (across
    machines the traffic is sealed instead)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=60)
    if not loopback_only:
        return dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
    listener = socket.create_server((host, 0), backlog=128)
    port = listener.getsockname()[1]
    # detached: the store owns the descriptor from here on and closes it
    return dist.TCPStore(
        host, port, is_master=True, wait_for_workers=False, timeout=timeout, master_listen_fd=listener.detach()
    )
