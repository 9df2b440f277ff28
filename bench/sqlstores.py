"""The fair store a benchmark runs on (``--store``), and the broker that goes with it.

``redis``: the run's own redis-server is broker, result backend and store (the original
benchmark). A SQL store (``postgresql``, ``mariadb``, ``sqlite``) is what a shop without
Redis runs, so its broker is RabbitMQ (a virtual host of the run's own on the server at
``CELERY_FAIR_RABBITMQ``), with no result backend; plain Celery is measured on that same
broker. The database is created for the run (``celery_fair_bench_<hex>``, migrated with
:func:`celery_fair.store.sql.migrate`) and dropped at the end. The redis-server stays, but
only for the benchmark's own counters (what the task body records), on both sides alike.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

import kombu

RABBITMQ_URL = os.environ.get("CELERY_FAIR_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672")
POSTGRESQL = os.environ.get("CELERY_FAIR_BENCH_POSTGRESQL", "postgresql+psycopg://postgres@127.0.0.1:5432")
MARIADB = os.environ.get("CELERY_FAIR_BENCH_MARIADB", "mysql+pymysql://root@127.0.0.1:3306")
STORES = ("redis", "postgresql", "mariadb", "sqlite")
_TICK = os.sysconf("SC_CLK_TCK")


class RabbitVhost:
    """A RabbitMQ virtual host of our own on the running server (deleted afterwards)."""

    def __init__(self, prefix: str = "fair-test-") -> None:
        self.name = prefix + uuid.uuid4().hex[:8]
        self._ctl("add_vhost", self.name)
        self._ctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")
        self.url = f"{RABBITMQ_URL}/{self.name}"
        with kombu.Connection(self.url, connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=3)

    @staticmethod
    def _ctl(*args: str) -> None:
        ctl = shutil.which("rabbitmqctl")
        if ctl is None:
            raise RuntimeError("rabbitmqctl not found: the RabbitMQ tests and a SQL store's "
                               "benchmark need the running RabbitMQ on 127.0.0.1:5672 "
                               "and its rabbitmqctl")
        done = subprocess.run([ctl, *args], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {done.stderr.strip()}")

    def delete(self) -> None:
        self._ctl("delete_vhost", self.name)


class Database:
    """A database of the run's own for a SQL store: created and migrated, then dropped."""

    def __init__(self, kind: str) -> None:
        from sqlalchemy import create_engine

        from celery_fair.store.sql import migrate

        self.kind = kind
        self.name = "celery_fair_bench_" + uuid.uuid4().hex[:8]
        self.tmp: str | None = None
        if kind == "sqlite":
            self.tmp = tempfile.mkdtemp(prefix="fair-bench-")
            self.url = f"sqlite:///{self.tmp}/{self.name}.db"
            self.admin = None
        else:
            server = POSTGRESQL if kind == "postgresql" else MARIADB
            self.admin = create_engine(server + ("/postgres" if kind == "postgresql" else "/"),
                                       isolation_level="AUTOCOMMIT")
            self._admin(f"CREATE DATABASE {self.name}")
            self.url = f"{server}/{self.name}"
        migrate(self.url)
        self.cpu = ServerCpu(self)

    def _admin(self, sql: str, **params: Any) -> list[Any]:
        from sqlalchemy import text

        assert self.admin is not None
        with self.admin.connect() as conn:
            result = conn.execute(text(sql), params)
            return list(result) if result.returns_rows else []

    def drop(self) -> None:
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        if self.kind == "postgresql":
            self._admin("DROP DATABASE IF EXISTS " + self.name + " WITH (FORCE)")
        else:
            self._admin("DROP DATABASE IF EXISTS " + self.name)
        assert self.admin is not None
        self.admin.dispose()


class ServerCpu:
    """CPU seconds the database server spent for this run, read from ``/proc``.

    PostgreSQL: the backends connected to the run's database (a process each; one that
    came and went between two readings is missed, but the store's pools keep theirs).
    MariaDB: the whole ``mysqld`` (its threads cannot be told apart without
    performance_schema, off here), so other jobs on the server count too. SQLite runs in
    the client process: None (its CPU is in the process's own figure).
    """

    def __init__(self, database: Database) -> None:
        self.db = database

    def seconds(self) -> dict[int, float] | None:
        if self.db.kind == "postgresql":
            pids = [row[0] for row in self.db._admin(
                "SELECT pid FROM pg_stat_activity WHERE datname = :d", d=self.db.name)]
        elif self.db.kind == "mariadb":
            pids = [int(p) for p in _pidof("mariadbd") or _pidof("mysqld")]
        else:
            return None
        return {pid: cpu for pid in pids if (cpu := _proc_cpu(pid)) is not None}


def _pidof(name: str) -> list[str]:
    done = subprocess.run(["pidof", name], capture_output=True, text=True)
    return done.stdout.split()


def _proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def server_delta(before: dict[int, float] | None, after: dict[int, float] | None
                 ) -> float | None:
    """Server CPU seconds between two :meth:`ServerCpu.seconds` readings."""
    if before is None or after is None:
        return None
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def process_cpu() -> float:
    """CPU seconds of this process and its waited-for children (a forked dispatcher)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
