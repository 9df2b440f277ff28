"""A private PostgreSQL server the chaos campaign crashes: ``--store postgresql``.

Never the machine's shared server on 5432 (other tests use it): :class:`PostgresNode`
runs ``initdb`` into a temporary directory and starts ``postgres`` on a free port of
127.0.0.1 with the Debian binaries (``/usr/lib/postgresql/<version>/bin``, or
``CHAOS_PG_BIN``). PostgreSQL refuses to run as root, so as root the server runs as
the ``postgres`` OS user (``setpriv``, which execs: the process started is the
postmaster itself) in a directory that user owns. Its one database, ``fair``, is
migrated with :func:`celery_fair.store.sql.migrate`, as ``fair migrate`` would.

A crash is SIGKILL of the postmaster alone, as the kernel's OOM killer does it: its
backends notice their parent is gone and exit; a new postmaster on the same port and
data directory starts once they have (it refuses while one still holds the old shared
memory), replays its WAL and serves the committed state.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from celery_fair.store.sql import migrate
from celery_fair.testing import free_port, pool_processes

from .services import Node, _wait

DATABASE = "fair"


def _bin_dir() -> Path:
    """Where ``initdb`` and ``postgres`` are: ``CHAOS_PG_BIN``, else the newest Debian
    install."""
    chosen = os.environ.get("CHAOS_PG_BIN") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)), "")
    if not chosen or not (Path(chosen) / "postgres").exists():
        raise RuntimeError("--store postgresql needs PostgreSQL's server binaries (initdb, "
                           "postgres): set CHAOS_PG_BIN to their directory (found none "
                           "under /usr/lib/postgresql/*/bin)")
    return Path(chosen)


def _as_postgres() -> tuple[list[str], tuple[int, int] | None]:
    """The command prefix and owner (uid, gid) that run the server as ``postgres`` when
    we are root; nothing when we are not (the server runs as us)."""
    if os.geteuid() != 0:
        return [], None
    user = pwd.getpwnam("postgres")
    return (["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
             "--init-groups"], (user.pw_uid, user.pw_gid))


class PostgresNode(Node):
    """A postgres of its own (data, socket directory, port, log), restartable on the same
    port and data."""

    def __init__(self, log: Path | None = None) -> None:
        self.bin = _bin_dir()
        self.prefix, owner = _as_postgres()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="chaos-postgres-"))
        self.data = self.dir / "data"
        self.log = log or self.dir / "postgres.log"
        self.log.touch()
        if owner is not None:
            for path in (self.dir, self.log):
                os.chown(path, *owner)
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{DATABASE}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._run([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                   "--auth=trust", "-E", "UTF8", "--no-sync"])
        self.start()
        with self._connect("postgres") as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}".encode())
        migrate(self.url)

    def _run(self, cmd: list[str]) -> None:
        with open(self.log, "ab") as out:
            subprocess.run([*self.prefix, *cmd], stdout=out, stderr=subprocess.STDOUT,
                           check=True, timeout=120, cwd=self.dir)

    def _connect(self, database: str = DATABASE) -> psycopg.Connection[object]:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                               dbname=database, autocommit=True, connect_timeout=2)

    def start(self) -> None:
        """Start the postmaster and wait until it answers (a crash recovery included)."""
        deadline = time.monotonic() + 60
        while True:
            with open(self.log, "ab") as out:
                self.proc = subprocess.Popen(
                    [*self.prefix, str(self.bin / "postgres"), "-D", str(self.data),
                     "-p", str(self.port), "-k", str(self.dir),
                     "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=300"],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                    cwd=self.dir)
            try:
                _wait(self._answers, 60, f"postgres on port {self.port}")
                return
            except _Exited:
                # Backends of the killed postmaster still hold its shared memory: they
                # exit by themselves within moments; try again until they have.
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres on port {self.port} did not start; "
                                       f"see {self.log}") from None
                time.sleep(0.2)

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise _Exited
        try:
            with self._connect("postgres") as conn:
                conn.execute(b"SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def kill(self) -> None:
        """SIGKILL the postmaster alone; return once it and its orphaned backends are gone
        (the stragglers SIGKILLed after 10 s)."""
        if self.proc is None:
            return
        backends = pool_processes(self.proc.pid)
        try:
            os.kill(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        _wait(lambda: not any(_alive(pid) for pid in backends), 10,
              "the killed postmaster's backends to exit", fail=False)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class _Exited(Exception):
    """The postmaster exited while starting."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[:1]
    except OSError:
        return False
