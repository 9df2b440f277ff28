"""Releases that could not reach the store, kept on local disk until they land.

A release marks a task done, so the copy the broker redelivers (acks_late) is skipped. When
the store is down as a task ends, the release waits in its process and is retried
(``worker.PendingReleases``); should that process die first — a worker crashing on the
outage takes its pool with it — the retry dies too and the copy would run the task again.
So a release that fails is also appended here, one file per process, and whoever meets
the dead process's dispatch replays its file: the copy about to take the run over
(``lifecycle.run_gone``) and every worker's lease keeper on this host.

A line is written to the page cache only (no fsync): it outlives the process, which is
what it is for; a machine that dies takes its runs with it anyway.

What is replayed marks tasks done, so the directory is private: this user's own, mode
0700 (``fair_spool_dir``; by default ``celery-fair-spool-<uid>`` in the temporary
directory). One owned by someone else, or open to group or others, is refused: anyone who
can write there could mark other people's tasks done. A file is named after its process's
pid, start time and a random nonce, so a later process given the same pid never writes
to, nor clears, the file of the dead one; and the per-store directory is named after this
host, boot and PID namespace too, since only there do its pids mean anything.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import tempfile
import threading
import uuid
from pathlib import Path

from .errors import ConfigurationError, ReplicationTimeout
from .host import identity, pid_alive, start_time
from .store.base import Store

logger = logging.getLogger(__name__)

#: How far a process's file grows with releases that all landed before it is emptied
#: (:meth:`Spool.landed`): about 200 lines, replayed as no-ops should the process die.
TRIM_BYTES = 32 * 1024


def default_root() -> Path:
    """Where spools live without ``fair_spool_dir``: one directory per user."""
    return Path(tempfile.gettempdir()) / f"celery-fair-spool-{os.getuid()}"


class UnsafeSpool(ConfigurationError):
    """The spool directory is not this user's private directory."""


def private_directory(path: Path) -> Path:
    """Create ``path`` (mode 0700) or check it is a directory of this user that nobody
    else can enter; raises UnsafeSpool naming it and what is wrong."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(path)
    except OSError as exc:
        raise UnsafeSpool(f"celery_fair spool directory {path} cannot be created: {exc}; "
                          "set fair_spool_dir to a directory of yours") from exc
    if not stat.S_ISDIR(info.st_mode):
        wrong = "is not a directory (a symlink?)"
    elif info.st_uid != os.getuid():
        wrong = f"is owned by uid {info.st_uid}, not by this user (uid {os.getuid()})"
    elif info.st_mode & 0o077:
        wrong = f"is open to group or others (mode {stat.S_IMODE(info.st_mode):04o})"
    else:
        return path
    raise UnsafeSpool(f"celery_fair spool directory {path} {wrong}: refusing to use it "
                      "(whoever can write there could mark tasks done); expected a "
                      "directory of this user with mode 0700 (set fair_spool_dir)")


class Spool:
    """One store's spool on this host: ``<pid>.<start>.<nonce>.jsonl`` files of failed
    releases, one per process."""

    def __init__(self, store: Store, root: Path | None = None) -> None:
        self.store = store
        self.root = root or default_root()
        digest = hashlib.sha1(
            f"{store.where}|{store.namespace}|{identity()}".encode()).hexdigest()[:16]
        self.directory = self.root / digest
        self._lock = threading.Lock()
        self._mine: tuple[int, str] = (0, "")  # (pid, its file name)
        self._open: tuple[int, int] = (0, -1)  # (pid, its file's descriptor)
        self._refused = ""  # the last refusal logged: once, not per release or beat
        self._written = 0  # bytes appended to this process's file since it was emptied

    def own_path(self) -> Path:
        """This process's file (a new name after fork)."""
        pid = os.getpid()
        if self._mine[0] != pid:
            self._mine = (pid, f"{pid}.{start_time() or 0}.{uuid.uuid4().hex[:12]}.jsonl")
        return self.directory / self._mine[1]

    def _checked(self) -> Path:
        private_directory(self.root)
        return private_directory(self.directory)

    def add(self, queue: str, did: str, done_seconds: int, run: str) -> None:
        """Keep one release of this process: failed, or on its way (written ahead)."""
        line = json.dumps({"q": queue, "d": did, "s": done_seconds, "r": run}) + "\n"
        try:
            with self._lock:
                self._written += os.write(self._descriptor(), line.encode())
        except (OSError, UnsafeSpool) as exc:  # the retry in memory still holds it
            self._refuse("could not spool a release", exc)

    def _descriptor(self) -> int:
        """This process's file, open to append: checked and opened once per process,
        since every task's release is written ahead (an append, a few microseconds; a
        file created and removed per task cost 150 us on overlayfs)."""
        pid, fd = self._open
        if pid != os.getpid():  # first use, or a forked child: its own file
            self._checked()
            fd = os.open(self.own_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT
                         | os.O_CLOEXEC, 0o600)
            self._open = (os.getpid(), fd)
        return fd

    def clear(self) -> None:
        """This process's releases all landed: its file is emptied (kept open for the
        next; the lease keepers remove it once the process is gone)."""
        with self._lock:
            pid, fd = self._open
            if pid == os.getpid():
                os.ftruncate(fd, 0)
            else:
                self.own_path().unlink(missing_ok=True)
            self._written = 0

    def landed(self) -> None:
        """This process's releases all landed (each task's, written ahead): its file is
        emptied once it has grown past :data:`TRIM_BYTES`, not after every task. A line
        of a release that landed is a no-op when replayed, and a truncate per task cost
        a syscall (about 20 µs here) on the hot path."""
        if self._written >= TRIM_BYTES:
            self.clear()

    def replay(self, pid: int) -> int:
        """Land the releases process ``pid`` (gone) left; returns how many landed.
        Raises FairError while the store is down (the files stay)."""
        return sum(self._replay(path) for path in self._dead_files(f"{pid}.*.jsonl"))

    def replay_dead(self) -> int:
        """Replay the files of every process of this host that is gone."""
        return sum(self._replay(path) for path in self._dead_files("*.jsonl"))

    def _dead_files(self, pattern: str) -> list[Path]:
        """Files matching ``pattern`` whose process is gone (not merely whose pid is)."""
        try:
            self._checked()
            paths = list(self.directory.glob(pattern))
        except (OSError, UnsafeSpool) as exc:
            self._refuse("not replaying the spool", exc)
            return []
        dead = []
        for path in paths:
            pid, _, started = path.name.partition(".")
            started = started.partition(".")[0]
            if pid.isdigit() and not pid_alive(int(pid), "" if started == "0" else started):
                dead.append(path)
        return dead

    def _refuse(self, what: str, exc: Exception) -> None:
        if str(exc) != self._refused:
            self._refused = str(exc)
            logger.error("celery_fair: %s (%s): %s", what, self.directory, exc)

    def _replay(self, path: Path) -> int:
        # Lines of releases that had landed are replayed too: a landed release is a no-op.
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return 0  # another replayer got it first
        landed = 0
        for line in lines:
            try:
                item = json.loads(line)
                queue, did, done, run = item["q"], item["d"], int(item["s"]), item["r"]
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line: the process died writing it
            try:
                self.store.release(queue, did, done, run=run or None)
            except ReplicationTimeout:
                pass  # its script ran: landed on the master (not replayed again)
            landed += 1
        path.unlink(missing_ok=True)
        if landed:
            logger.warning("celery_fair: landed %d releases a process that died left (%s)",
                           landed, path.name)
        return landed


_spools: dict[tuple[str, str, str], Spool] = {}


def spool_for(store: Store, root: str | None = None) -> Spool:
    """The spool of ``store`` under ``root`` (``fair_spool_dir``; None: the default)."""
    key = (store.where, store.namespace, root or "")
    spool = _spools.get(key)
    if spool is None:
        spool = _spools[key] = Spool(store, Path(root) if root else None)
    return spool
