"""How the chaos campaign judges what happened (bench/chaos.py): the figures read from
the ledger (:class:`Measuring`), why a task ran twice, which runs overlapped a cap
violation, where a lost task is, celery-fair's own invariant checker, and the canary that
counts the acknowledged writes a Redis restart or crash forgot.
"""

from __future__ import annotations

import importlib
import threading
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from celery_fair.task import store_for

#: A message a worker received this long before a broker outage may still be running or
#: unacked when the outage strikes, so its redelivery counts as the outage's doing.
OUTAGE_REACH = 20.0
#: The documented instant a SIGKILL can run a task twice in (DESIGN.md, "Dispatch state
#: machine"): after the run's end is stamped in the ledger, inside the body, and before
#: the body returns and its release is written ahead to the process's spool. That tail
#: is the ledger's own commit (a PostgreSQL round trip: 1-40 ms on a busy machine),
#: bounded generously; a worker found exited by itself is stamped when the campaign
#: notices (every 0.25 s). A kill any later met a release already spooled, which the
#: host's lease keepers land, or landed: a duplicate after it is not the kill's doing,
#: even while the store is cut off (the spooled release waits it out). ``KILL_SLACK``
#: allows for the kill's time being taken just before the signal is sent.
RELEASE_REACH = 0.5
KILL_SLACK = 0.05


class Canary:
    """Counts the acknowledged writes Redis forgot across its restarts and crashes.

    It INCRs one key every few milliseconds; a reply at or below one Redis had already
    acknowledged means Redis came back without the writes in between. Held tasks are
    written the same way, so a task lost while the canary lost nothing is celery-fair's
    doing, and one lost beside a canary loss may be Redis's.
    """

    KEY = "chaos:canary"

    def __init__(self, url: str) -> None:
        self.url = url
        self.lost = 0

    def run(self, stop: threading.Event) -> None:
        client = redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=2)
        acked = 0
        while not stop.wait(0.005):
            try:
                value = int(client.incr(self.KEY))
            except redis.RedisError:
                continue  # Redis is down: the next reply after it is back tells
            if value <= acked:
                self.lost += acked - value + 1
            acked = value


def duplicate_causes(runs: list[tuple[str, str, int, float, float | None]],
                     events: list[tuple[float, str, int]],
                     examples: dict[str, Any] | None = None) -> Counter[str]:
    """Why each extra completed run of a task happened, judged from the campaign's events.

    ``worker_kill``: the worker of the previous run died in the instant between that
    run's end and its body's return (:func:`in_release_window`), before the release was
    written ahead: to celery-fair the body had not finished, so its lease (or the
    broker's copy) ran it again: the one duplicate a SIGKILL may cause (DESIGN.md). A
    worker killed later than that had spooled or landed the release: a duplicate after
    it is some other cause's, or unexplained.
    ``broker_outage``: the broker restarted between the two starts (the ack could not be
    sent; the message may have reached the worker up to ``OUTAGE_REACH`` seconds before
    the outage and run just after it). ``store_failover``: the store's master was killed
    and a replica promoted between them (``--store sentinel`` or ``cluster``: a pick,
    begin or release the new master never received; with fair_store_replicas it fails
    the run all the same, see ``FailoverFigures``). ``unexplained``: neither; a bug. Up to 5
    unexplained ones go into ``examples``.
    """
    completed: dict[str, list[tuple[int, float, float]]] = {}
    for task, _, worker_pid, started, ended in runs:
        if ended is not None:
            completed.setdefault(task, []).append((worker_pid, started, ended))
    causes: Counter[str] = Counter()
    for task, done in completed.items():
        for (pid, first, end), (_, again, _) in zip(done, done[1:]):
            if any(what == "worker" and who == pid and first <= t <= again
                   and in_release_window(end, t) for t, what, who in events):
                cause = "worker_kill"
            elif any(what == "outage" and first - OUTAGE_REACH <= t <= again
                     for t, what, _ in events):
                cause = "broker_outage"
            elif any(what == "failover" and first - OUTAGE_REACH <= t <= again
                     for t, what, _ in events):
                cause = "store_failover"
            else:
                cause = "unexplained"
            causes[cause] += 1
            if examples is not None and len(examples) < 5:
                examples[task] = {"cause": cause, "runs": done, "events": [
                    e for e in events if first - 15 <= e[0] <= again + 1]}
    return causes


def in_release_window(end: float, kill: float) -> bool:
    """Whether a kill at ``kill`` came between a run's ``end`` (as the ledger stamped it)
    and the moment its body returned and wrote its release ahead: ``RELEASE_REACH``.
    A store cut off or restarting then stretches nothing: the release is spooled before
    the store call blocks."""
    return end - KILL_SLACK <= kill <= end + RELEASE_REACH


def overlapping(runs: list[tuple[str, str, int, float, float | None]], group: str,
                 at: float) -> list[Any]:
    """The runs of ``group`` going on at ``at``, each with every run of its task."""
    tasks = {task for task, grp, _, started, ended in runs
             if grp == group and started <= at and (ended is None or ended >= at)}
    return [[task, [(pid, s, e) for t, _, pid, s, e in runs if t == task]]
            for task in sorted(tasks)]


def singleton_overlaps(runs: list[tuple[str, str, int, float, float | None]],
                       key_of: dict[str, str]) -> list[list[Any]]:
    """Pairs of finished runs of one singleton key, of different tasks, whose times
    overlap: [key, (task, started, ended), (task, started, ended)]. A run a kill cut
    short has no end, so it is left out (it stopped at the kill, unrecorded); two runs
    of one task are the duplicates' business."""
    by_key: dict[str, list[tuple[float, float, str]]] = {}
    for task, _, _, started, ended in runs:
        if ended is not None and task in key_of:
            by_key.setdefault(key_of[task], []).append((started, ended, task))
    found: list[list[Any]] = []
    for key, spans in sorted(by_key.items()):
        spans.sort()
        last = spans[0]  # of the runs started so far, the one that ends last
        for span in spans[1:]:
            if span[0] < last[1] and span[2] != last[2]:
                found.append([key, (last[2], last[0], last[1]),
                              (span[2], span[0], span[1])])
            if span[1] > last[1]:
                last = span
    return found


def is_duplicate(task_runs: list[Any], at: float) -> bool:
    """A run going on at ``at`` is a second run of a task that had already completed."""
    return any(end is not None and end < at for _, _, end in task_runs) and \
        any(start <= at and (end is None or end >= at) for _, start, end in task_runs)


def run_check(app: Celery) -> Any:
    """celery-fair's invariant checker (``celery_fair.check``), when this version has one:
    its findings as data (none is the only good answer)."""
    try:
        checker = importlib.import_module("celery_fair.check")
    except ImportError:
        return "celery_fair.check not available"
    report = checker.check(app)
    return report.to_dict() if hasattr(report, "to_dict") else repr(report)


class Measuring:
    """The campaign's verdict, read from the ledger, its events and the store (a mixin of
    :class:`bench.chaos.Campaign`, whose attributes it reads)."""

    figures: Any
    ledger: Any
    app: Celery
    queue: str
    task_ids: list[str]
    events: list[tuple[float, str, int]]
    workdir: Path
    postgres: Any
    singleton_of: dict[str, str]

    def _inflight(self) -> int:
        raise NotImplementedError

    def _measure(self) -> None:
        f = self.figures
        runs = self.ledger.runs()
        done = Counter(task for task, _, _, _, ended in runs if ended is not None)
        f.completed = sum(1 for t in self.task_ids if done[t])
        f.tasks_lost = len(self.task_ids) - f.completed
        lost = [t for t in self.task_ids if not done[t]]
        f.lost_examples = {t: self._whereabouts(t) for t in lost[:5]}
        f.logs = str(self.workdir)
        f.duplicates_executed = sum(n - 1 for n in done.values() if n > 1)
        f.duplicate_causes = dict(duplicate_causes(runs, self.events,
                                                   f.duplicate_examples))
        f.interrupted_runs = sum(1 for *_, ended in runs if ended is None)
        if f.namespaced_workers:
            f.namespaced_runs = sum(1 for _, _, worker, _, _ in runs if worker == 1)
        f.duplicates_skipped = self.ledger.skipped_count()
        f.skipped_examples = [list(s) for s in self.ledger.skipped_list()]
        violations = self.ledger.cap_violations()
        f.cap_violations = len(violations)
        causes: Counter[str] = Counter()
        for group, _, _, at in violations:
            beside = overlapping(runs, group, at)
            explained = any(is_duplicate(task_runs, at) for _, task_runs in beside)
            causes["duplicate_run" if explained else "unexplained"] += 1
            if not explained and len(f.cap_examples) < 3:
                f.cap_examples.append(beside)
        f.cap_violation_causes = dict(causes)
        overlaps = singleton_overlaps(runs, self.singleton_of)
        f.singleton_overlaps, f.singleton_examples = len(overlaps), overlaps[:3]
        f.runs_at_cap = self.ledger.runs_at_cap()
        f.ledger_running = self.ledger.unfinished()
        f.leaked_slots = max(self._inflight(), 0)
        f.kills = dict(f.kills)

    def _whereabouts(self, task_id: str) -> dict[str, Any]:
        """Where a task that never completed is: held, a dispatch record, the broker."""
        if self.postgres is not None:
            return self._located(task_id)
        store = store_for(self.app)
        client, k = store.client, store.keys(self.queue)
        try:
            records = {}
            for key in client.scan_iter(match=k.prefix.replace("{", "\\{")
                                        .replace("}", "\\}") + ":d:*", count=1000):
                fields = client.hgetall(key)
                if fields.get(b"id", b"").decode().split("~")[0] == task_id:
                    records[key.decode()] = {a.decode(): b.decode(errors="replace")
                                             for a, b in fields.items() if a != b"v"}
            in_broker = [name for name in (self.queue, "unacked")
                         if any(task_id.encode() in item for item in
                                (client.lrange(self.queue, 0, -1) if name == self.queue
                                 else client.hvals(name)))]
            # held under its own id, or as a copy held again under ``<id>~<dispatch>``
            held = [h.decode() for h in client.hkeys(k.msg)
                    if h.decode().split("~")[0] == task_id]
            quarantined = [h.decode() for h in client.hkeys(k.quarantine)
                           if h.decode().split("~")[0] == task_id]
            return {"held": held, "quarantined": quarantined, "dispatches": records,
                    "runs": [r for r in self.ledger.runs() if r[0] == task_id],
                    "in_broker": in_broker}
        except Exception as exc:  # noqa: BLE001 - a diagnosis must not hide the verdict
            return {"error": repr(exc)}

    def _located(self, task_id: str) -> dict[str, Any]:
        """Where a task that never completed is, as the store contract's ``locate`` says
        (a SQL store has no Redis keys to read)."""
        try:
            where = store_for(self.app).locate(task_id)
        except Exception as exc:  # noqa: BLE001 - a diagnosis must not hide the verdict
            return {"error": repr(exc)}
        return {"location": asdict(where) if where is not None else None,
                "runs": [r for r in self.ledger.runs() if r[0] == task_id]}
