"""The execution ledger: what the chaos tasks really did, kept in PostgreSQL.

celery-fair's own bookkeeping lives in Redis, which the chaos campaign restarts; so "every
task ran exactly once" and "no group ever ran above its cap" are checked in a store
celery-fair never touches. Each task body records its start and its end; each stale
duplicate the worker skipped is recorded too (see ``bench/chaos_proj.py``).

Concurrency per group is judged from the runs' own start and end times, taken inside
each task under its group's row lock (so starts and ends of one group are totally
ordered): a run overlaps every run of its group that started before it and had not ended
yet. A run cut short by a kill has no end; it lasts until its process died, which the
campaign records (:meth:`Ledger.died`) with the time it sent the SIGKILL. (A count taken
at start time alone would be fooled: the dead process's last transaction may commit after
the kill, and RabbitMQ redelivers its task within milliseconds.) The count seen at start
(``concurrent``) is kept to show the caps did bind (:meth:`Ledger.runs_at_cap`).

Each ledger lives in a schema of its own (``Ledger.create``), dropped by ``drop``.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

#: Where the ledger lives unless ``CHAOS_PG`` says otherwise.
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"

_SCHEMA = """
CREATE TABLE {s}.groups (grp text PRIMARY KEY, cap integer NOT NULL);
CREATE TABLE {s}.runs (
    id bigserial PRIMARY KEY, task_id text NOT NULL, label text NOT NULL,
    grp text NOT NULL, pid integer NOT NULL, worker_pid integer NOT NULL,
    started double precision NOT NULL, ended double precision,
    concurrent integer NOT NULL);
CREATE INDEX ON {s}.runs (task_id);
CREATE TABLE {s}.running (
    run_id bigint PRIMARY KEY, grp text NOT NULL, worker_pid integer NOT NULL);
CREATE INDEX ON {s}.running (grp);
CREATE TABLE {s}.deaths (
    worker_pid integer NOT NULL, pid integer, at double precision NOT NULL);
CREATE TABLE {s}.skipped (
    id bigserial PRIMARY KEY, task_id text NOT NULL, dispatch_id text,
    pid integer NOT NULL, at double precision NOT NULL);
"""


class LedgerUnavailable(RuntimeError):
    """PostgreSQL, which the chaos ledger needs, cannot be reached."""


def connect(dsn: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise LedgerUnavailable(
            f"cannot reach PostgreSQL at {dsn!r} for the execution ledger "
            f"(set CHAOS_PG to a reachable database): {exc}") from None


@dataclass
class Ledger:
    """One run's ledger: schema ``schema`` in the database at ``dsn``."""

    dsn: str
    schema: str

    def __post_init__(self) -> None:
        self._conn: psycopg.Connection[Any] | None = None
        self._pid = 0

    @classmethod
    def create(cls, dsn: str | None = None, caps: dict[str, int] | None = None) -> Ledger:
        """A fresh ledger in a new schema; ``caps`` are the groups' concurrency caps."""
        ledger = cls(dsn or os.environ.get("CHAOS_PG") or DEFAULT_DSN,
                     "chaos_" + uuid.uuid4().hex[:12])
        conn = ledger.conn()
        conn.execute(f"CREATE SCHEMA {ledger.schema}")
        conn.execute(_SCHEMA.format(s=ledger.schema))
        if caps:
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {ledger.schema}.groups VALUES (%s, %s)",
                                list(caps.items()))
        return ledger

    def conn(self) -> psycopg.Connection[Any]:
        """This process's connection (a forked pool process opens its own)."""
        if self._conn is None or self._pid != os.getpid() or self._conn.closed:
            self._conn = connect(self.dsn)
            self._pid = os.getpid()
        return self._conn

    def drop(self) -> None:
        self.conn().execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        self.close()

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    # -- written by the tasks ------------------------------------------------------------

    def start(self, task_id: str, label: str, group: str) -> int:
        """Record a run starting; returns its id. Counts the group's running runs."""
        s, conn = self.schema, self.conn()
        with conn.transaction():
            # The group's row lock serialises starts and ends of one group.
            conn.execute(f"INSERT INTO {s}.groups VALUES (%s, -1) ON CONFLICT DO NOTHING",
                         (group,))
            conn.execute(f"SELECT 1 FROM {s}.groups WHERE grp = %s FOR UPDATE",
                         (group,))
            row = conn.execute(f"SELECT count(*) + 1 FROM {s}.running WHERE grp = %s",
                               (group,)).fetchone()
            concurrent = int(row[0]) if row else 1
            run = conn.execute(
                f"INSERT INTO {s}.runs (task_id, label, grp, pid, worker_pid, started, "
                "concurrent) VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
                (task_id, label, group, os.getpid(), os.getppid(), time.time(),
                 concurrent)).fetchone()
            assert run is not None
            conn.execute(f"INSERT INTO {s}.running VALUES (%s, %s, %s)",
                         (run[0], group, os.getppid()))
        return int(run[0])

    def end(self, run_id: int, group: str) -> None:
        s, conn = self.schema, self.conn()
        with conn.transaction():
            conn.execute(f"SELECT 1 FROM {s}.groups WHERE grp = %s FOR UPDATE",
                         (group,))
            conn.execute(f"DELETE FROM {s}.running WHERE run_id = %s", (run_id,))
            conn.execute(f"UPDATE {s}.runs SET ended = %s WHERE id = %s",
                         (time.time(), run_id))

    def skipped(self, task_id: str, dispatch_id: str | None) -> None:
        """The worker skipped a stale duplicate of ``task_id`` (celery-fair's Ignore)."""
        self.conn().execute(
            f"INSERT INTO {self.schema}.skipped (task_id, dispatch_id, pid, at) "
            "VALUES (%s, %s, %s, %s)", (task_id, dispatch_id, os.getpid(), time.time()))

    # -- read and tidied by the campaign -------------------------------------------------

    def died(self, worker_pid: int, pid: int | None, at: float) -> None:
        """A worker (``pid`` None) or one of its pool processes was killed at ``at``: its
        runs without an end lasted until then."""
        s, conn = self.schema, self.conn()
        conn.execute(f"INSERT INTO {s}.deaths VALUES (%s, %s, %s)", (worker_pid, pid, at))
        conn.execute(f"DELETE FROM {s}.running WHERE run_id IN (SELECT id FROM {s}.runs "
                     "WHERE worker_pid = %s AND (%s::integer IS NULL OR pid = %s))",
                     (worker_pid, pid, pid))

    def runs(self) -> list[tuple[str, str, int, float, float | None]]:
        """Every run: (task id, group, worker pid, started, ended or None)."""
        return [tuple(r) for r in self.conn().execute(
            f"SELECT task_id, grp, worker_pid, started, ended FROM {self.schema}.runs "
            "ORDER BY id")]

    def completed(self) -> int:
        row = self.conn().execute(
            f"SELECT count(DISTINCT task_id) FROM {self.schema}.runs "
            "WHERE ended IS NOT NULL").fetchone()
        return int(row[0]) if row else 0

    def skipped_list(self, limit: int = 5) -> list[tuple[str, str | None, int, float]]:
        """Up to ``limit`` skipped copies: (task id, dispatch id, pid, when)."""
        rows = self.conn().execute(
            f"SELECT task_id, dispatch_id, pid, at FROM {self.schema}.skipped ORDER BY at "
            "LIMIT %s", (limit,)).fetchall()
        return [(str(t), d, int(p), float(a)) for t, d, p, a in rows]

    def skipped_count(self) -> int:
        row = self.conn().execute(f"SELECT count(*) FROM {self.schema}.skipped").fetchone()
        return int(row[0]) if row else 0

    def _lives(self) -> str:
        """Each run with the time it stopped: its end, else its process's death, else
        never (infinity)."""
        s = self.schema
        return (f"SELECT r.id, r.grp, r.started, COALESCE(r.ended, (SELECT min(d.at) FROM "
                f"{s}.deaths d WHERE d.worker_pid = r.worker_pid AND (d.pid IS NULL OR "
                f"d.pid = r.pid) AND d.at >= r.started), 'infinity') AS until "
                f"FROM {s}.runs r")

    def unfinished(self) -> int:
        """Runs that never ended although their process did not die: still running."""
        row = self.conn().execute(
            f"SELECT count(*) FROM ({self._lives()}) l WHERE l.until = 'infinity'"
        ).fetchone()
        return int(row[0]) if row else 0

    def runs_at_cap(self) -> int:
        """Runs that found their group exactly at its cap when they started."""
        row = self.conn().execute(
            f"SELECT count(*) FROM {self.schema}.runs r JOIN {self.schema}.groups g "
            "USING (grp) WHERE r.concurrent = g.cap").fetchone()
        return int(row[0]) if row else 0

    def cap_violations(self) -> list[tuple[str, int, int, float]]:
        """Runs that started while their group already ran ``cap`` others:
        (group, cap, runs at once, start)."""
        lives = self._lives()
        return [tuple(r) for r in self.conn().execute(
            f"WITH l AS MATERIALIZED ({lives}) "
            "SELECT a.grp, g.cap, count(*)::integer, a.started "
            f"FROM l a JOIN {self.schema}.groups g USING (grp) "
            "JOIN l b ON b.grp = a.grp AND b.started <= a.started AND b.until > a.started "
            "AND b.started > a.started - 600 "
            "WHERE g.cap >= 0 GROUP BY a.id, a.grp, g.cap, a.started "
            "HAVING count(*) > g.cap ORDER BY a.id")]
