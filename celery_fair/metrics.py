"""Prometheus metrics of a dispatcher, served on ``/metrics`` (``--metrics-port``).

Two kinds of figures:

- **store-wide**, read from Redis at each scrape: held tasks, in flight, caps and weights,
  releases (counted by ``release.lua`` in the workers), live dispatchers per queue (their
  heartbeats: ``celery_fair_dispatchers``). Every dispatcher of a store shows
  the same values: aggregate them with ``max``, not ``sum``.
  The oldest head waits (``celery_fair_oldest_wait_seconds``, and per group) are read
  over the top groups only (below), like Flower's. The tip-of-queue waits
  (``celery_fair_oldest_head_wait_seconds{queue}``, alert on it, and
  ``celery_fair_group_head_wait_seconds`` for the ``fair_metrics_groups`` groups whose
  heads waited longest, small tenants included; a head waits from when it became its
  group's head, or due when later: :func:`~celery_fair.store.heads.head_wait`) come
  from :meth:`Store.longest_heads <celery_fair.store.heads.HeadWaits.longest_heads>`: a
  bounded scan, O(min(groups, 10,000)) reads per scrape.
- **this dispatcher's own**, counted as it works: dispatches, lease reclaims, the wait from
  hold to dispatch, step durations and the loop's lag. Sum those across dispatchers.

Label cardinality is capped: per-group series exist only for the ``fair_metrics_groups``
groups holding the most tasks (the store's ``backlog`` ranking, re-read every
:data:`TOP_GROUPS_SECONDS`); every other group is summed under group ``_other``. The wait
histogram keeps a group's series until a new top group needs its place
(:meth:`DispatcherMetrics.wait_label`). Each scrape reads O(queues x that many groups)
keys, whatever the number of groups.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .envelope import INTERACTIVE
from .errors import ConfigurationError, FairError
from .liveness import serving_counts
from .store.base import GroupHeads, as_json, now_ms
from .store.heads import head_due, head_wait

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

    from .dispatcher import Dispatcher

logger = logging.getLogger(__name__)

#: The label standing for every group outside the top groups.
OTHER = "_other"
#: How often the top groups (the ones with series of their own) are chosen again.
TOP_GROUPS_SECONDS = 5.0
#: Buckets of the hold-to-dispatch wait (seconds): from instant to an hour.
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800,
                3600, float("inf"))
CLASS_NAMES = {INTERACTIVE: "interactive", "b": "background"}
#: The live dispatchers per fair queue (dashboards and alert rules use this name).
DISPATCHERS = "celery_fair_dispatchers"


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "the dispatcher's metrics need prometheus_client: "
            "pip install 'celery-fair[metrics]'") from None
    return prometheus_client


class DispatcherMetrics:
    """The metrics of one dispatcher, in a registry of their own.

    Attach with :meth:`attach` (the dispatcher then reports each dispatch, reclaim and
    step) and serve with :meth:`serve`.
    """

    def __init__(self, dispatcher: Dispatcher, top_groups: int) -> None:
        prom = _prometheus()
        self.dispatcher = dispatcher
        self.top = top_groups
        self.registry: CollectorRegistry = prom.CollectorRegistry(auto_describe=True)
        self.dispatched = prom.Counter(
            "celery_fair_dispatched", "Tasks this dispatcher published to the broker.",
            ["queue", "class"], registry=self.registry)
        self.reclaimed = prom.Counter(
            "celery_fair_lease_reclaims",
            "Slots taken back when a lease ran out: outcome 'requeued' (the dispatcher died "
            "before the broker took it; held again) or 'lost' (its worker died).",
            ["queue", "outcome"], registry=self.registry)
        self.wait = prom.Histogram(
            "celery_fair_wait_seconds", "From hold (or due time) to dispatch, per class.",
            ["queue", "class"], buckets=WAIT_BUCKETS, registry=self.registry)
        self.group_wait = prom.Histogram(
            "celery_fair_group_wait_seconds",
            f"From hold (or due time) to dispatch, per top group ({OTHER}: the others).",
            ["queue", "group"], buckets=WAIT_BUCKETS, registry=self.registry)
        self.step_seconds = prom.Histogram(
            "celery_fair_step_seconds", "Duration of one dispatcher step (all queues).",
            registry=self.registry)
        self.registry.register(_StoreCollector(self))
        self._top: dict[str, tuple[float, list[str]]] = {}
        self._labelled: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self.last_step = time.monotonic()
        self.server: Any = None

    def attach(self) -> DispatcherMetrics:
        self.dispatcher.observer = self
        return self

    # -- reported by the dispatcher ---------------------------------------------------

    def on_dispatch(self, queue: str, group: str, klass: str, due_at: float | None) -> None:
        self.dispatched.labels(queue, CLASS_NAMES.get(klass, klass)).inc()
        if due_at is None:  # held by a version that did not record it
            return
        waited = max(time.time() - due_at, 0.0)
        self.wait.labels(queue, CLASS_NAMES.get(klass, klass)).observe(waited)
        self.group_wait.labels(queue, self.wait_label(queue, group)).observe(waited)

    def on_reclaim(self, queue: str, requeued: int, lost: int) -> None:
        if requeued:
            self.reclaimed.labels(queue, "requeued").inc(requeued)
        if lost:
            self.reclaimed.labels(queue, "lost").inc(lost)

    def on_step(self, seconds: float) -> None:
        self.step_seconds.observe(seconds)
        self.last_step = time.monotonic()

    # -- the top groups ------------------------------------------------------------------

    def top_groups(self, queue: str) -> list[str]:
        """The groups of ``queue`` holding the most tasks (re-read every few seconds)."""
        with self._lock:
            cached = self._top.get(queue)
            if cached is not None and time.monotonic() - cached[0] < TOP_GROUPS_SECONDS:
                return cached[1]
        groups = [g for g, _ in self.dispatcher.store.top_groups(queue, self.top)]
        with self._lock:
            self._top[queue] = (time.monotonic(), groups)
        return groups

    def wait_label(self, queue: str, group: str) -> str:
        """``group`` when it has (or gets) a wait series of its own, else ``_other``.

        A top group gets a series; it keeps it after leaving the top until a new top group
        needs its place (then its series is removed), so at most ``top`` groups per queue
        have one and series do not come and go with every change of the ranking.
        """
        top = self.top_groups(queue)
        with self._lock:
            labelled = self._labelled.setdefault(queue, [])
            if group in labelled:
                return group
            if group not in top:
                return OTHER
            if len(labelled) >= self.top:
                gone = next((g for g in labelled if g not in top), None)
                if gone is None:
                    return OTHER
                labelled.remove(gone)
                self.group_wait.remove(queue, gone)
            labelled.append(group)
            return group

    # -- serving -----------------------------------------------------------------------

    def serve(self, port: int, address: str = "0.0.0.0") -> int:
        """Serve ``/metrics`` on ``address:port`` in a daemon thread; returns the port
        (useful with port 0)."""
        self.server, _ = _prometheus().start_http_server(port, addr=address,
                                                         registry=self.registry)
        bound = int(self.server.server_port)
        logger.info("serving Prometheus metrics on http://%s:%d/metrics", address, bound)
        return bound

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class _StoreCollector:
    """Store-wide gauges, read at each scrape (bounded reads per queue)."""

    def __init__(self, metrics: DispatcherMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # no fixed series: do not read the store at registration

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        m = self.metrics
        store = m.dispatcher.store
        families = store_families()
        waits = head_wait_families()
        serving: dict[str, int] | None = None
        try:
            queues = store.queues()
            for queue in queues:
                add_queue_figures(families, queue, as_json(store.queue_figures(queue)),
                                  [as_json(r) for r in
                                   store.group_figures(queue, m.top_groups(queue))],
                                  m.dispatcher.capacity(queue))
                add_head_waits(waits, queue, store.summarize(queue, m.top_groups(queue)))
                add_longest_heads(waits, queue, store.longest_heads(queue, m.top))
            serving = serving_counts(store.dispatchers(now_ms()), queues)
        except FairError as exc:
            logger.warning("metrics: reading the store failed: %s", exc)
        yield from families.values()
        yield from waits.values()
        if serving is not None:
            yield dispatchers_family(serving)
        yield GaugeMetricFamily("celery_fair_loop_lag_seconds",
                                "Seconds since the dispatcher last finished a step (below "
                                "about 1 s while it is healthy, even when idle).",
                                value=time.monotonic() - m.last_step)


# -- store-wide families: shared by the dispatcher's /metrics and Flower's ---------------


_Q, _G = ["queue"], ["queue", "group"]
#: The store-wide families: key, type, name, help, labels.
STORE_FAMILIES = (
    ("held", "gauge", "celery_fair_held_tasks",
     f"Held tasks per group ({OTHER}: the others) and class; not delayed ones.",
     _G + ["class"]),
    ("inflight", "gauge", "celery_fair_inflight_tasks",
     f"Dispatched and not yet released, per group ({OTHER}: the others).", _G),
    ("cap", "gauge", "celery_fair_group_cap",
     "Concurrency cap of a top group (absent: none).", _G),
    ("weight", "gauge", "celery_fair_group_weight", "Weight of a top group.", _G),
    ("delayed", "gauge", "celery_fair_delayed_tasks",
     "Tasks waiting for their ETA/countdown.", _Q),
    ("capacity", "gauge", "celery_fair_capacity",
     "Live workers' slots for the queue, or fair_max_inflight (the dispatcher's view; "
     "fair_dispatch_ahead more may be in flight).", _Q),
    ("groups", "gauge", "celery_fair_active_groups",
     "Groups with held, delayed or in-flight tasks.", _Q),
    ("ready", "gauge", "celery_fair_ready_groups",
     "Groups eligible for dispatch now, per class.", _Q + ["class"]),
    ("released", "counter", "celery_fair_released",
     "Dispatches whose end the workers reported.", _Q),
    ("skipped", "counter", "celery_fair_skipped", "Copies the workers skipped: a stale "
     "duplicate, or a redelivery of a dispatch that already ran.", _Q),
)


def dispatchers_family(serving: Mapping[str, int]) -> Metric:
    """``celery_fair_dispatchers{queue}``: the live dispatchers serving each fair queue
    (from their heartbeats; 0 with held work: nothing dispatches it). Store-wide, like
    :func:`store_families`: the dispatcher's ``/metrics`` and Flower's both build it."""
    from prometheus_client.core import GaugeMetricFamily

    family = GaugeMetricFamily(DISPATCHERS, "Live dispatchers serving the fair queue (their "
                               "heartbeats); 0 while it holds work means nothing runs it.",
                               labels=["queue"])
    for queue, count in sorted(serving.items()):
        family.add_metric([queue], count)
    return family


def store_families() -> dict[str, Metric]:
    """The store-wide metric families, empty (fill them with :func:`add_queue_figures`).

    The dispatcher's ``/metrics`` and Flower's (:mod:`celery_fair.contrib.flower`) both
    build theirs here, so the two show the same names, labels and help.
    """
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
    return {key: kinds[kind](name, doc, labels=labels)
            for key, kind, name, doc, labels in STORE_FAMILIES}


def add_queue_figures(families: dict[str, Any], queue: str, totals: Mapping[str, Any],
                      rows: Iterable[Mapping[str, Any]], capacity: int | None) -> None:
    """Add ``queue``'s figures to :func:`store_families`' families: ``totals`` as
    :class:`~celery_fair.store.base.QueueFigures` has them, ``rows`` (the top groups) as
    :class:`~celery_fair.store.base.GroupFigures` does (both as JSON documents: the
    summary a dispatcher wrote feeds them too); every other
    group is summed under ``_other``. A total missing from ``totals`` (a summary written by
    an older dispatcher) has no sample."""
    rows = list(rows)

    def add(name: str, labels: list[str], value: Any) -> None:
        if value is not None:
            families[name].add_metric(labels, value)

    def other(key: str) -> int | None:
        total = totals.get(key)
        return None if total is None else max(total - sum(r[key] for r in rows), 0)

    for klass in ("interactive", "background"):
        key = f"held_{klass}"
        for row in rows:
            add("held", [queue, row["group"], klass], row[key])
        add("held", [queue, OTHER, klass], other(key))
    for row in rows:
        add("inflight", [queue, row["group"]], row["inflight"])
        add("weight", [queue, row["group"]], row["weight"])
        add("cap", [queue, row["group"]], row["cap"])
    add("inflight", [queue, OTHER], other("inflight"))
    add("delayed", [queue], totals.get("delayed"))
    add("capacity", [queue], capacity)
    add("groups", [queue], totals.get("group_count"))
    add("ready", [queue, "interactive"], totals.get("ready_interactive"))
    add("ready", [queue, "background"], totals.get("ready_background"))
    add("released", [queue], totals.get("released"))
    add("skipped", [queue], totals.get("skipped"))


def head_wait_families() -> dict[str, Metric]:
    """The oldest-wait gauges (what the wait histogram cannot show: a task not dispatched
    yet), filled by :func:`add_head_waits`; the names and labels are Flower's."""
    from prometheus_client.core import GaugeMetricFamily

    return {
        "queue": GaugeMetricFamily(
            "celery_fair_oldest_wait_seconds", "How long the oldest held task of the top "
            "groups has waited since due (0: they hold nothing).", labels=_Q),
        "group": GaugeMetricFamily(
            "celery_fair_group_oldest_wait_seconds",
            "How long a top group's oldest held task has waited since due.", labels=_G),
        "head_queue": GaugeMetricFamily(
            "celery_fair_oldest_head_wait_seconds", "How long the longest-waiting group "
            "head of the queue has waited since it became the head (or due, when later), "
            "over every group (0: none held).", labels=_Q),
        "head_group": GaugeMetricFamily(
            "celery_fair_group_head_wait_seconds", "How long a group's head has waited "
            "since it became the head (or due, when later), for the groups whose heads "
            "waited longest.", labels=_G),
    }


def add_head_waits(families: dict[str, Any], queue: str, heads: Iterable[GroupHeads],
                   now: float | None = None) -> None:
    """Add ``queue``'s head waits (``heads``: :meth:`Store.summarize` of its top groups)."""
    now = time.time() if now is None else now
    oldest = 0.0
    for head in heads:
        due = head_due(head)
        if due is not None:
            wait = max(now - due, 0.0)
            families["group"].add_metric([queue, head.group], wait)
            oldest = max(oldest, wait)
    families["queue"].add_metric([queue], oldest)


def add_longest_heads(families: dict[str, Any], queue: str, heads: list[GroupHeads],
                      now: float | None = None) -> None:
    """Add ``queue``'s tip-of-queue waits (``heads``: :meth:`Store.longest_heads`, the
    longest-waiting first): one series per listed group, and the longest per queue. A
    head waits from when it became the head (or due, when later): a group served
    steadily from a long backlog shows a short wait, a stuck one a growing one."""
    now = time.time() if now is None else now
    waits = [(h.group, wait) for h in heads if (wait := head_wait(h, now)) is not None]
    for group, wait in waits:
        families["head_group"].add_metric([queue, group], wait)
    families["head_queue"].add_metric([queue], max((w for _, w in waits), default=0.0))
