"""A small per-queue summary the dispatcher keeps in Redis, for dashboards (Flower).

A dashboard must not scan every group of a busy fair queue on each page load, and a web
process cannot know the dispatcher's view of capacity. So each dispatcher step calls
:meth:`SummaryWriter.maybe_write`, which about once a second (in one long-lived thread)
writes one JSON document per fair queue to ``<prefix>:{<queue>}:summary``: totals, and
the groups holding the most (at most ``limit``) with their figures. The key expires after
``ttl`` seconds, so the summary of a queue whose dispatchers all died disappears instead
of showing stale figures. Writing one reads O(limit) keys, whatever the number of groups:
the totals are the store's counters, the groups come from its ``backlog`` ranking.

Summary fields (version 2): ``queue``, ``written_at`` (epoch seconds), ``ttl``,
``capacity``, ``dispatch_ahead`` and ``inflight_limit`` (their sum: what the dispatcher lets
be in flight), as :func:`queue_capacity` defines them (None: not read yet), ``inflight``,
``held_interactive``, ``held_background``, ``delayed``, ``groups_total`` (exact, every
group counted), ``oldest_wait`` (seconds the oldest held message **of the listed groups**
has waited since it became due; None when they hold nothing: a group outside the list
is not read), ``head_wait`` (seconds the longest-waiting head **of the listed groups**
has waited since it became its group's head, or due when later: a group served steadily
shows a short one, a stuck one a growing one; None when they hold nothing),
``ready_interactive``, ``ready_background`` (groups eligible now),
``released``, ``skipped`` (the store's counters), ``release_rate`` (releases a second,
smoothed over about ``RATE_WINDOW`` seconds from the previous summary's ``released`` and
``written_at``, whichever dispatcher wrote it; None until two summaries a short while
apart exist: :func:`celery_fair.position` estimates waits from it) and ``groups``: a
list of ``{group, held_interactive, held_background, inflight, delayed, cap, weight, oldest_wait,
head_wait, limited}`` sorted by held tasks, most first (``limited``: what a runtime limit sets,
``cap`` and/or ``weight``).

The module also holds the one definition of a fair queue's capacity (:class:`Capacity`,
:func:`queue_capacity`) that ``fair status``, the summary (so Flower) and the dispatcher's
log all use, and ``fair status``'s reading of a queue (:func:`queue_status`).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from .capacity import dispatch_ahead
from .config import FairConfig
from .errors import FairError
from .outage import Outage
from .policies import NO_AFFINITY, PolicyChoice
from .store.base import GroupHeads, Store, as_json, now_ms
from .store.heads import head_wait

logger = logging.getLogger(__name__)

SUMMARY_VERSION = 2
#: How often a dispatcher writes the summaries.
INTERVAL_SECONDS = 1.0
#: How long a summary outlives its last write.
TTL_SECONDS = 10
#: Most groups listed per queue (the totals count every group).
GROUP_LIMIT = 100
#: Totals of :meth:`Store.queue_figures` a summary carries under their own name
#: (for Flower's ``/metrics``, which shows what the dispatcher's shows).
EXTRA_TOTALS = ("ready_interactive", "ready_background", "released", "skipped")
#: Seconds the summary's ``release_rate`` averages over (an exponential moving average).
RATE_WINDOW = 30.0
#: Groups read per ``summarize`` call: bounds how long one call keeps Redis busy.
CHUNK = 200


class Capacity(NamedTuple):
    """How many tasks a fair queue may have in flight, in two parts shown apart.

    ``capacity``: the live workers' slots (the sum of the pools of the workers consuming
    the queue, with ``fair_max_inflight = "auto"``) or ``fair_max_inflight`` itself.
    ``ahead``: the dispatch-ahead allowance on top of it (``fair_dispatch_ahead``, only
    with ``auto`` and at least one live worker). So 6 in flight against a capacity of 4
    (+2 ahead) is within the limit, not a broken cap.
    """

    capacity: int
    ahead: int

    @property
    def limit(self) -> int:
        """Tasks in flight the dispatcher allows: the capacity plus the ahead."""
        return self.capacity + self.ahead

    def __str__(self) -> str:
        return f"{self.capacity}" + (f" (+{self.ahead} ahead)" if self.ahead else "")

    def as_json(self) -> dict[str, int]:
        return {"capacity": self.capacity, "dispatch_ahead": self.ahead,
                "inflight_limit": self.limit}


def queue_capacity(config: FairConfig, slots: int, refills: bool) -> Capacity:
    """A fair queue's :class:`Capacity` given its live workers' ``slots`` and whether
    releases refill the slots they free (the one definition: the dispatcher, ``fair
    status`` and the summary all call this)."""
    if config.max_inflight is not None:
        return Capacity(config.max_inflight, 0)
    return Capacity(slots, dispatch_ahead(config.dispatch_ahead, refills) if slots else 0)


def read_capacity(store: Store, config: FairConfig, queue: str) -> Capacity:
    """``queue``'s :class:`Capacity` from the workers registered in the store now, and
    from whether a dispatcher lets its releases refill now (the parameters it leaves
    in the store: refill.py)."""
    if config.max_inflight is not None:
        return queue_capacity(config, 0, False)
    slots = store.worker_capacity(queue, now_ms())
    refills = config.dispatch_ahead is None and bool(slots) and store.refilling(queue)
    return queue_capacity(config, slots, refills)


def queue_status(store: Store, config: FairConfig, queue: str, top: int) -> dict[str, Any]:
    """``fair status``'s figures of ``queue``: the store's totals, its policy (the
    settings', as its dispatchers configure it: ``policy`` and ``charge``), its
    :class:`Capacity`, the oldest wait
    and the longest head wait (over the same ``GROUP_LIMIT`` busiest groups as the
    summary, so they match Flower's) and the ``top`` busiest groups with their own."""
    now = time.time()
    figures = store.queue_figures(queue)
    rows = store.busiest_groups(queue, max(top, GROUP_LIMIT))
    heads = {f.group: f for f in _figures(store, queue, [r.group for r in rows])}
    shown = rows[:top]
    choice = config.policy_for(queue)
    return {**as_json(figures), "policy": choice.name, "charge": choice.charge,
            "cap_mode": choice.cap_mode, "interactive_share": choice.interactive_share,
            "aging_seconds": choice.aging_seconds, "subgroup": choice.subgroup,
            "scope": choice.scope,
            **read_capacity(store, config, queue).as_json(),
            "oldest_wait": _wait(heads.values(), now),
            "head_wait": _head_wait(heads.values(), now),
            "groups": [{**as_json(r), "oldest_wait": _wait([heads[r.group]], now),
                        "head_wait": _head_wait([heads[r.group]], now)} for r in shown],
            "more_groups": max(figures.group_count - len(shown), 0),
            **_affinity(store, choice, queue)}


def _affinity(store: Store, choice: PolicyChoice, queue: str) -> dict[str, Any]:
    """fair_affinity's figures (routed queues only, fair_group_queues too): the groups
    moved from one target to another so far, each target's routed dispatches in flight."""
    if choice.affinity == NO_AFFINITY and not choice.group_queues:
        return {}
    # fair_group_queues: the targets in flight include the dedicated queues (queue:<name>)
    return {"affinity": choice.affinity, "spill_seconds": choice.spill_seconds,
            "group_queues": dict(choice.group_queues),
            "affinity_moves": store.affinity_moves(queue),
            "worker_inflight": store.worker_inflight(queue)}


def _capacity_fields(capacity: Capacity | None) -> Mapping[str, int | None]:
    if capacity is None:
        return {"capacity": None, "dispatch_ahead": None, "inflight_limit": None}
    return capacity.as_json()


def build_summary(store: Store, queue: str, capacity: Capacity | None, *,
                  now: float | None = None, limit: int = GROUP_LIMIT) -> dict[str, Any]:
    """The summary document of ``queue`` (see the module docstring).

    Reads O(limit) keys whatever the number of groups: the totals come from the ``stat``
    counters (:meth:`Store.queue_figures`), the listed groups from the ``backlog``
    ranking (:meth:`Store.busiest_groups`).
    """
    now = time.time() if now is None else now
    totals = store.queue_figures(queue)
    rows = store.busiest_groups(queue, limit)
    dues = {f.group: f for f in _figures(store, queue, [r.group for r in rows])}
    return {
        "version": SUMMARY_VERSION, "queue": queue, "written_at": now, "ttl": TTL_SECONDS,
        **_capacity_fields(capacity), "inflight": totals.inflight,
        "held_interactive": totals.held_interactive,
        "held_background": totals.held_background,
        "delayed": totals.delayed,
        "oldest_wait": _wait(dues.values(), now),
        "head_wait": _head_wait(dues.values(), now),
        "groups_total": totals.group_count,
        **{key: getattr(totals, key) for key in EXTRA_TOTALS},
        "groups": [{
            "group": r.group, "held_interactive": r.held_interactive,
            "held_background": r.held_background, "inflight": r.inflight,
            "delayed": r.delayed, "cap": r.cap, "weight": r.weight,
            "oldest_wait": _wait([dues[r.group]], now),
            "head_wait": _head_wait([dues[r.group]], now), "limited": list(r.limited),
        } for r in rows],
    }


def _figures(store: Store, queue: str, groups: Sequence[str]) -> Iterator[GroupHeads]:
    """Head due times (and counts) of ``groups``, ``CHUNK`` groups per store call."""
    for start in range(0, len(groups), CHUNK):
        yield from store.summarize(queue, groups[start:start + CHUNK])


def _wait(figures: Iterable[GroupHeads], now: float) -> float | None:
    dues = [due for f in figures for due in (f.due_interactive, f.due_background)
            if due is not None]
    return max(0.0, round(now - min(dues), 3)) if dues else None


def _head_wait(figures: Iterable[GroupHeads], now: float) -> float | None:
    """The longest head wait of ``figures`` (:func:`~celery_fair.store.heads.head_wait`)."""
    waits = [w for f in figures if (w := head_wait(f, now)) is not None]
    return round(max(waits), 3) if waits else None


class SummaryWriter:
    """Writes every fair queue's summary, at most once per ``interval``, in a thread.

    The dispatcher calls :meth:`maybe_write` each step; when a round is due it hands the
    queues and capacities to one long-lived writer thread (started on the first call), so
    dispatching never waits for the reads. Should a round be slow (a slow or distant
    Redis, many fair queues), the next one waits ten times as long as it took (the
    summary uses at most about a tenth of a Redis connection's time), and the TTL grows
    with it so the summary never lapses between rounds. With several dispatchers, the
    first to write in an interval wins (a ``SET NX`` guard key) and the others skip, so
    the work is not repeated. A store outage is logged once when it starts and once when
    it ends, not every round.
    """

    def __init__(self, store: Store, *, interval: float = INTERVAL_SECONDS,
                 ttl: int = TTL_SECONDS, limit: int = GROUP_LIMIT) -> None:
        self.store = store
        self.interval = interval
        self.ttl = ttl
        self.limit = limit
        self._gap = interval
        self._next = 0.0  # monotonic; inf while a round is handed over and not yet done
        self._round: tuple[list[str], dict[str, Capacity]] | None = None
        self._due = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None  # the writer, while it runs
        self._lock = threading.Lock()
        self._outage = Outage(logger, "writing the fair queue summaries",
                              expected=(FairError,))  # the store wraps its errors

    def maybe_write(self, queues: Iterable[str], capacity: Mapping[str, Capacity]) -> None:
        """Hand a round of writes to the writer thread if one is due and none is pending."""
        if time.monotonic() < self._next:
            return
        with self._lock:
            self._next = math.inf  # write_all sets the next time once the round is done
            self._round = (list(queues), dict(capacity))
            self._stopping.clear()  # in use again after stop()
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name="celery-fair-summary")
                self._thread.start()
        self._due.set()

    def stop(self) -> None:
        """Let the writer thread end once the round handed to it (if any) is written."""
        self._stopping.set()
        self._due.set()

    def _loop(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            with self._lock:
                work, self._round = self._round, None
            if work is not None:
                try:
                    self.write_all(*work)
                except Exception as exc:  # noqa: BLE001 - the thread outlives any failure
                    self._next = time.monotonic() + self._gap
                    self._outage.failed(exc, "trying again next round")
            with self._lock:  # a round handed over meanwhile is written before it ends
                if self._stopping.is_set() and self._round is None:
                    self._thread = None
                    return

    def write_all(self, queues: Iterable[str], capacity: Mapping[str, Capacity]) -> None:
        """Write the summary of each of ``queues``; a failure is only logged (once per
        outage: the first WARNING, then DEBUG until a write works again)."""
        started = time.monotonic()
        for queue in queues:
            try:
                self.write(queue, capacity.get(queue))
            except FairError as exc:
                self._outage.failed(exc, f"queue {queue}: summary not written; retrying")
            else:
                self._outage.ok()
        self._gap = max(self.interval, 10 * (time.monotonic() - started))
        self._next = started + self._gap

    def write(self, queue: str, capacity: Capacity | None) -> bool:
        """Write ``queue``'s summary unless another dispatcher just did; True if written."""
        if not self.store.claim_writer(queue, max(1, int(self._gap * 900))):
            return False
        summary = build_summary(self.store, queue, capacity, limit=self.limit)
        summary["release_rate"] = release_rate(
            self.store.summaries([queue]).get(queue), summary)
        summary["ttl"] = ttl = max(self.ttl, int(3 * self._gap) + 1)
        self.store.put_summary(queue, json.dumps(summary), ttl)
        return True


def release_rate(previous: str | None, summary: Mapping[str, Any]) -> float | None:
    """Releases a second: the rate since the ``previous`` summary document, averaged
    with its own rate over about :data:`RATE_WINDOW` seconds. None with no basis: no
    previous summary (or one from another version, a counter reset or a long gap)."""
    if not previous:
        return None
    before = json.loads(previous)
    elapsed = summary["written_at"] - before.get("written_at", 0)
    done = summary["released"] - before.get("released", 0)
    if before.get("version") != SUMMARY_VERSION or done < 0 or not 0 < elapsed < RATE_WINDOW:
        return None
    now = float(done / elapsed)
    old = before.get("release_rate")
    if old is None:
        return round(now, 3)
    share = 1 - math.exp(-elapsed / RATE_WINDOW)
    return round(share * now + (1 - share) * float(old), 3)


def format_wait(seconds: float | None) -> str:
    """A wait for people (Flower's page, ``fair status``): ``-``, ``850 ms``, ``12.3 s``,
    ``4m 05s``, ``2h 01m``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    return f"{minutes // 60}h {minutes % 60:02d}m"


def read_summaries(store: Store) -> dict[str, dict[str, Any] | None]:
    """Every fair queue's summary (None where no live dispatcher wrote one), by queue."""
    return {queue: json.loads(doc) if doc else None
            for queue, doc in store.summaries(store.queues()).items()}
