"""A private RabbitMQ node for the chaos campaign, which SIGKILLs and restarts it.

Never the shared server on 5672: this node has its own name (``chaos-<port>@localhost``),
AMQP and distribution ports, data, logs, config and Erlang cookie (``HOME``), all under one
temporary directory. It runs ``/usr/lib/rabbitmq/bin/rabbitmq-server`` directly (Debian's
``/usr/sbin`` wrapper would switch to the ``rabbitmq`` user and the shared data directory).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import kombu

from celery_fair.testing import free_port

from .services import Node

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


class RabbitNode(Node):
    """A RabbitMQ node of our own; ``url`` is its guest/guest AMQP address."""

    def __init__(self, workdir: Path) -> None:
        binary = SERVER if os.path.exists(SERVER) else shutil.which("rabbitmq-server")
        if binary is None:
            raise RuntimeError("rabbitmq-server is not installed: the chaos campaign's "
                               "--broker amqp run needs it (apt-get install rabbitmq-server)")
        self.binary = binary
        self.port = free_port()
        self.dir = workdir / f"rabbit-{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "rabbitmq.conf").write_text(
            f"loopback_users = none\nlisteners.tcp.default = 127.0.0.1:{self.port}\n")
        (self.dir / "enabled_plugins").write_text("[].\n")
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.env = {
            **os.environ, "HOME": str(self.dir),
            "RABBITMQ_NODENAME": f"chaos-{self.port}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.dir / "rabbit.pid"),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self, timeout: float = 120) -> None:
        with open(self.dir / "server.out", "ab") as out:
            self.proc = subprocess.Popen([self.binary], env=self.env, cwd=self.dir,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._reachable():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.dir / "server.out").read_text(errors="replace")[-3000:]
                self.kill()
                raise RuntimeError(f"private RabbitMQ node on port {self.port} did not "
                                   f"start:\n{log}")
            time.sleep(0.5)

    def _reachable(self) -> bool:
        try:
            with kombu.Connection(self.url, connect_timeout=2) as conn:
                conn.connect()
            return True
        except Exception:  # noqa: BLE001 - not up yet
            return False

