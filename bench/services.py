"""Servers and processes the chaos campaign kills and restarts.

- :class:`RedisNode`: a redis-server of its own (AOF on, ``appendfsync everysec`` unless
  told otherwise) that can be restarted (SIGTERM: Redis writes out its AOF first) or
  crashed (SIGKILL) and started again on the same port and directory.
- :class:`RabbitNode`: a private RabbitMQ node (its own node name, ports, data and config
  directories), never the shared server on 5672.
- :class:`CeleryProc`: one ``celery -A bench.chaos_proj ...`` process in its own session,
  so a SIGKILL takes its pool processes with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from celery_fair.testing import free_port, pool_processes, redis_server_binary

ROOT = Path(__file__).resolve().parent.parent
CELERY = str(Path(sys.executable).with_name("celery"))


def _wait(predicate: object, timeout: float, what: str, fail: bool = True) -> None:
    """Poll ``predicate`` until true; after ``timeout`` raise (``fail``) or return."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            if not fail:
                return
            raise RuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


class Node:
    """A server in its own process group that the campaign SIGKILLs and starts again."""

    dir: str | Path
    proc: subprocess.Popen[bytes] | None

    def start(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL the server (and its process group); returns once it is dead."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)

    def terminate(self, timeout: float = 30) -> None:
        """SIGTERM the server, as a service manager stops it; SIGKILL after ``timeout``."""
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def restart(self, down: float = 0.5, crash: bool = True) -> None:
        """Stop (``crash``: SIGKILL, else SIGTERM), stay down ``down`` seconds, start again
        on the same port and data."""
        if crash:
            self.kill()
        else:
            self.terminate()
        time.sleep(down)
        self.start()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisNode(Node):
    """A redis-server with an append-only file, restartable on the same port and data."""

    def __init__(self, fsync: str = "everysec", log: Path | None = None) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="chaos-redis-")
        self.log = log or Path(self.dir) / "redis.log"
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.args = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                     "--dir", self.dir, "--appendonly", "yes", "--appendfsync", fsync,
                     "--save", ""]
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        client = redis.Redis(port=self.port)
        _wait(lambda: self._ping(client), 30, f"redis-server on port {self.port}")
        client.close()

    def _ping(self, client: redis.Redis) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"redis-server on port {self.port} exited "
                               f"({self.proc.returncode})")
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.BusyLoadingError):
            return False


class CeleryProc:
    """``celery -A bench.chaos_proj <args>`` in its own session, logging to a file;
    under ``wrap`` (``unshare --pid --fork ...``: a PID namespace of its own) if given."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path,
                 wrap: tuple[str, ...] = ()) -> None:
        self.args = args
        self.log = log
        self.wrapped = bool(wrap)
        full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([*wrap, CELERY, "-A", "bench.chaos_proj", *args],
                                         cwd=ROOT, env=full_env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        """The celery process, as this (the host's) PID namespace numbers it."""
        if self.wrapped:
            children = pool_processes(self.proc.pid)  # unshare's one child: celery
            return children[0] if children else self.proc.pid
        return self.proc.pid

    @property
    def own_pid(self) -> int:
        """The celery process as it numbers itself (what the ledger records): 1 in a PID
        namespace of its own."""
        return 1 if self.wrapped else self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the process and its pool children; returns once it is dead."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)

    def stop(self, timeout: float = 20) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)  # celery itself, not unshare
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def tail(self, chars: int = 3000) -> str:
        try:
            text = self.log.read_bytes().decode(errors="replace")
        except OSError:
            return ""
        return f"--- {' '.join(self.args[:1])} {self.log.name} ---\n{text[-chars:]}"
