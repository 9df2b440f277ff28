"""A store that stops answering for one worker only: a TCP relay in front of Redis.

The chaos campaign points one worker's ``fair_store_url`` here (its broker stays direct)
and calls :meth:`StoreProxy.cut`: for a while the relay forwards nothing, so that worker's
store commands hang until their timeouts — a partition between it and the store, not a
store restart. Connections that lived through the cut are dropped when it ends, so a
command sent into the cut never reaches Redis late.
"""

from __future__ import annotations

import select
import socket
import threading


class StoreProxy:
    """Relays ``127.0.0.1:<port>`` to Redis on ``target_port``; ``url`` is its address."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"  # for a Redis store
        self._up = threading.Event()
        self._up.set()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="store-proxy").start()

    def cut(self, seconds: float) -> None:
        """Forward nothing for ``seconds``; then drop what lived through it."""
        self._up.clear()
        threading.Event().wait(seconds)  # the campaign's blow: block as a restart does
        self._up.set()

    def close(self) -> None:
        self._closed = True
        self._up.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        try:
            if not self._up.is_set():  # connected into the cut: hears nothing, then goes
                self._up.wait()
                return
            upstream = socket.create_connection(self.target, timeout=5)
            self._relay(client, upstream)
        except OSError:
            pass  # Redis down or a side closed: the client sees its connection drop
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    sock.close()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        pair = [client, upstream]
        while not self._closed:
            if not self._up.is_set():
                self._up.wait()
                return  # lived through a cut: dropped
            ready, _, _ = select.select(pair, [], [], 0.1)
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    return
                (upstream if sock is client else client).sendall(data)
