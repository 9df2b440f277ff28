"""Releases that could not reach the store, kept on local disk until they land.

A release marks a task done, so the copy the broker redelivers (acks_late) is skipped. When
the store is down as a task ends, the release waits in its process and is retried
(``worker.PendingReleases``); should that process die first — a worker crashing on the
outage takes its pool with it — the retry dies too and the copy would run the task again.
So a release that fails is also appended here, one file per process, and whoever meets
the dead process's dispatch replays its file: the copy about to take the run over
(``task.run_gone``) and every worker's lease keeper on this host.

A line is written to the page cache only (no fsync): it outlives the process, which is
what it is for; a machine that dies takes its runs with it anyway.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path

from .host import pid_alive
from .store.redis import RedisStore

logger = logging.getLogger(__name__)

#: The spools of every store live under here (one directory per store and namespace).
ROOT = Path(tempfile.gettempdir()) / "celery-fair-spool"


class Spool:
    """One store's spool on this host: ``<pid>.jsonl`` files of failed releases."""

    def __init__(self, store: RedisStore, root: Path = ROOT) -> None:
        self.store = store
        digest = hashlib.sha1(f"{store.where}|{store.namespace}".encode()).hexdigest()[:16]
        self.directory = root / digest
        self._lock = threading.Lock()

    def path(self, pid: int) -> Path:
        return self.directory / f"{pid}.jsonl"

    def add(self, queue: str, did: str, done_seconds: int, run: str) -> None:
        """Keep one failed release of this process."""
        line = json.dumps({"q": queue, "d": did, "s": done_seconds, "r": run})
        try:
            with self._lock:
                self.directory.mkdir(parents=True, exist_ok=True)
                with open(self.path(os.getpid()), "a", encoding="utf-8") as fh:
                    fh.write(line + "\n")
        except OSError as exc:  # the retry in memory still holds it
            logger.warning("celery_fair: could not spool a release to %s: %s",
                           self.directory, exc)

    def clear(self) -> None:
        """This process's pending releases all landed."""
        with self._lock:
            self.path(os.getpid()).unlink(missing_ok=True)

    def replay(self, pid: int) -> int:
        """Land the releases process ``pid`` (gone) left; returns how many landed.
        Raises FairError while the store is down (the file stays)."""
        path = self.path(pid)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return 0
        landed = 0
        for line in lines:
            try:
                item = json.loads(line)
                queue, did, done, run = item["q"], item["d"], int(item["s"]), item["r"]
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line: the process died writing it
            self.store.release(queue, did, done, run=run or None)
            landed += 1
        path.unlink(missing_ok=True)
        if landed:
            logger.warning("celery_fair: landed %d releases process %d left when it died",
                           landed, pid)
        return landed

    def replay_dead(self) -> int:
        """Replay the files of every process of this host that is gone."""
        try:
            names = [p.stem for p in self.directory.glob("*.jsonl")]
        except OSError:
            return 0
        landed = 0
        for name in names:
            if name.isdigit() and not pid_alive(int(name)):
                landed += self.replay(int(name))
        return landed


_spools: dict[tuple[str, str], Spool] = {}


def spool_for(store: RedisStore) -> Spool:
    key = (store.where, store.namespace)
    spool = _spools.get(key)
    if spool is None:
        spool = _spools[key] = Spool(store)
    return spool

