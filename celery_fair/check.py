"""The invariant checker: does the store still hold together? (``celery fair check``)

After a crash, a bug, a Redis failover or a hand edit, the store's counters and indexes may
disagree with what it holds: a slot counted in flight that no dispatch holds (the group
stays capped for ever), a group with held work missing from its ready set (it starves), a
message no list refers to (it never runs). :func:`check` finds such states with a Lua
script (``store/lua/check.lua``) run in bounded steps: each call is atomic over a batch
of a few hundred entries, so a live dispatcher is never seen half-way through an
operation and Redis (often the broker too) is never blocked for long; a count that sums
several calls is re-counted atomically before it is reported. With ``repair=True`` it
fixes each finding and says how.

Repairs never drop a held message: an unreferenced one is held again, an undecodable one
moves to the queue's ``quarantine`` hash, a key of a foreign type is renamed aside.

Under ``fair_scope`` 'app' it also checks the namespace's shared state: each group's
in-flight count over the app-scoped queues against the sum of theirs, and charge
totals left of groups none of them knows (findings with queue ``APP_WIDE``, shown as
"app scope").

Given the app's name (``fair check`` passes its ``-A``), it also reports a fair queue
holding work that no live dispatcher serves (``no_dispatcher``: nothing would ever run
it; only starting a dispatcher, which the finding names, repairs it) and lists the live
dispatchers (``liveness.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from celery import Celery

from .liveness import read_liveness
from .store.base import CHECK_BATCH, Store, now_ms

#: The ``queue`` of a finding about the namespace's shared state (``fair_scope`` 'app':
#: ``Store.check_scope``), not about one queue.
APP_WIDE = ""

#: Lease given to an in-flight dispatch found without one when the store is passed
#: directly (with an app, its ``fair_lease_seconds``).
DEFAULT_LEASE_SECONDS = 30.0


@dataclass(frozen=True)
class Finding:
    """One broken invariant in one fair queue."""

    queue: str
    #: what is wrong, a stable identifier (``group_inflight``, ``orphan_message``...)
    kind: str
    #: the group, hold id, dispatch id or key concerned
    subject: str
    detail: str
    #: what the repair did; empty when nothing was done
    action: str = ""

    @property
    def repaired(self) -> bool:
        return bool(self.action)

    def __str__(self) -> str:
        done = f" -> {self.action}" if self.action else ""
        where = f"queue {self.queue}" if self.queue != APP_WIDE else "app scope"
        return f"{where}: {self.kind} {self.subject}: {self.detail}{done}"


@dataclass
class Report:
    """What :func:`check` found (and repaired) in the fair queues it checked."""

    queues: list[str]
    repair: bool
    findings: list[Finding] = field(default_factory=list)
    #: the live dispatchers' beats (None: liveness not checked)
    dispatchers: list[dict[str, Any]] | None = None

    @property
    def ok(self) -> bool:
        """No invariant was broken."""
        return not self.findings

    @property
    def problems(self) -> list[Finding]:
        """Findings left as they were (report mode, or not repairable)."""
        return [f for f in self.findings if not f.repaired]

    def kinds(self) -> set[str]:
        return {f.kind for f in self.findings}

    def to_dict(self) -> dict[str, Any]:
        doc = {"queues": self.queues, "repair": self.repair, "ok": self.ok,
               "findings": [asdict(f) for f in self.findings]}
        return doc if self.dispatchers is None else {**doc, "dispatchers": self.dispatchers}

    def __str__(self) -> str:
        if self.ok:
            return f"ok: {len(self.queues)} fair queue(s) checked, no problems"
        lines = [str(f) for f in self.findings]
        fixed = len(self.findings) - len(self.problems)
        lines.append(f"{len(self.findings)} problem(s) in {len(self.queues)} fair queue(s)"
                     + (f", {fixed} repaired" if self.repair else ""))
        return "\n".join(lines)


def check(target: Celery | Store, *, repair: bool = False,
          queues: Iterable[str] | None = None, lease_seconds: float | None = None,
          batch: int = CHECK_BATCH, app_name: str | None = None) -> Report:
    """Check the invariants of every fair queue (or ``queues``) of an app or a store.

    Parameters:
        target: a Celery app using celery_fair (its store and ``fair_lease_seconds``), or
            a :class:`~celery_fair.store.base.Store`.
        repair: fix every finding that can be fixed (each says what was done).
        queues: fair queues to check; default all the store knows.
        lease_seconds: lease given to an in-flight dispatch found without one.
        batch: most entries one step reads (each step blocks the store that long).
        app_name: the app as the user names it (``celery -A <app_name>``): when given,
            also report queues holding work that no live dispatcher serves, naming the
            command that starts one, and list the live dispatchers.

    Returns:
        a :class:`Report`; ``report.ok`` is true when nothing was found.

    Raises:
        StoreConnectionError: the store cannot be reached.
    """
    store, lease = _store_and_lease(target)
    if lease_seconds is not None:
        lease = lease_seconds
    lost = [] if queues is not None else _unregistered(store, repair)
    names = sorted(set(queues)) if queues is not None else sorted({*store.queues(), *lost})
    report = Report(queues=names, repair=repair)
    report.findings += [Finding(queue, "queue_unregistered", queue, "holds work but is "
                                "missing from the set of fair queues: no dispatcher "
                                "serves it", "added back" if repair else "")
                        for queue in lost]
    # first: a repaired app count changes eligibility, which each queue's check then sees
    report.findings += [Finding(APP_WIDE, kind, subject, detail, action) for
                        kind, subject, detail, action in store.check_scope(repair, batch=batch)]
    for queue in names:
        for kind, subject, detail, action in store.check(queue, repair, now_ms(),
                                                         int(lease * 1000), batch=batch):
            report.findings.append(Finding(queue, kind, subject, detail, action))
    if app_name is not None:
        live = read_liveness(store, app_name, names)
        report.dispatchers = [beat.as_json() for beat in live.dispatchers]
        report.findings += [Finding(queue, "no_dispatcher", queue, warning)
                            for queue, warning in zip(live.unserved, live.warnings())]
    return report


def _unregistered(store: Store, repair: bool) -> list[str]:
    """The queues holding work but missing from the set of fair queues (added back with
    ``repair``): only a store registering a queue in a step of its own can lose one, a
    Redis Cluster's (``ClusterStore.unregistered_queues``)."""
    find = getattr(store, "unregistered_queues", None)
    return [] if find is None else list(find(repair))


def _store_and_lease(target: Celery | Store) -> tuple[Store, float]:
    if isinstance(target, Store):
        return target, DEFAULT_LEASE_SECONDS
    from .config import get_config
    from .store import store_for

    return store_for(target), get_config(target).lease_seconds
