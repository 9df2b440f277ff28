"""A store that stopped answering: a listener whose connections open and then hear nothing.

The kernel completes the TCP handshake for a listening socket up to its backlog whether or
not anyone accepts, so a client connects at once and then waits for an answer that never
comes: what a hung Redis, a frozen VM or a network partition after the connect look like.
"""

from __future__ import annotations

import socket
from typing import Any


class Blackhole:
    """``with Blackhole() as hole: hole.url`` — a redis:// URL that never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> Blackhole:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.sock.close()
