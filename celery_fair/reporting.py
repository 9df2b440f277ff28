"""What a dispatcher tells its log: one line when it starts, then a report while it works.

At start (:func:`log_start`), one INFO line: the store (password masked) and namespace,
the queues served, the policy and where the capacity comes from. Then, every
``fair_report_interval`` seconds (:class:`Reporter`, called after each step), one INFO
line per fair queue with work (held, delayed or in flight, or dispatched meanwhile)::

    fair report queue=jobs dispatched=12.5/s held=40 delayed=0 in_flight=10/8 ahead=2
    oldest_wait=3.20s top_group=acme top_wait=3.20s

(one line in the log). ``in_flight`` is what is in flight over the live workers' slots
(``fair_max_inflight``: that number), ``ahead`` the ``fair_dispatch_ahead`` messages
allowed beyond them. A report costs one store read, whatever the number of groups:
dispatched/s is this dispatcher's own count over the interval; the rest comes from the
queue summaries the dispatchers already write about once a second (``summary.py``), so
it is up to about a second old, and the oldest wait and top group are those of the
summary's busiest groups. A queue without a summary yet is reported from its O(1)
counters, its waits shown as ``-``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .capacity import AUTO_AHEAD
from .config import FairConfig
from .errors import FairError
from .redact import safe_url
from .shards import Shard
from .store.base import Store
from .store.base import now_ms as _now_ms
from .summary import Capacity

# The dispatcher's log: users filter on this name.
logger = logging.getLogger("celery_fair.dispatcher")



def log_start(store: Store, config: FairConfig, fixed_queues: Sequence[str] | None,
              shard: Shard | None = None) -> None:
    """Log the dispatcher's start line. Reads the queues and their live workers once; a
    store that does not answer leaves them unknown rather than failing the start."""
    try:
        queues = [q for q in fixed_queues or store.queues() if shard is None or shard.serves(q)]
        capacity = capacity_source(store, config, queues)
    except FairError as exc:
        queues, capacity = list(fixed_queues or []), f"unknown until the store answers ({exc})"
    served = ", ".join(queues) or "none yet"
    logger.info("celery_fair dispatcher started: store %s (namespace %r), queues %s, "
                "policy %s, capacity %s", safe_url(config.store_url), config.key_prefix,
                served if fixed_queues else
                f"{'all' if shard is None else f'shard {shard} of the'} fair queues "
                f"(now: {served})",
                policy_words(config), capacity)


def policy_words(config: FairConfig) -> str:
    """The policies in words, with their companions where not the default
    (``PolicyChoice.describe``): the app-wide one, then each queue's own ("wfq
    (exports: wfq, charge runtime, soft-cap)"; Harmony charges nothing)."""
    own = ", ".join(f"{queue}: {choice.describe()}" for queue, choice
                    in sorted(config.queue_policies.items()))
    return config.policy.describe() + (f" ({own})" if own else "")


def capacity_source(store: Store, config: FairConfig, queues: Sequence[str]) -> str:
    """Where each queue's capacity comes from, in words, with its figures now."""
    if config.max_inflight is not None:
        return f"fixed, {config.max_inflight} per queue (fair_max_inflight)"
    now = _now_ms()
    pools = {queue: store.worker_pools(queue, now) for queue in queues}
    found = "; ".join(f"{queue}: {_plural(len(p), 'live worker')}, "
                      f"{_plural(sum(p.values()), 'slot')}" for queue, p in pools.items())
    return (f"auto, the live workers' pools ({found or 'no queue yet'}) "
            f"+ {_ahead_words(config.dispatch_ahead)} (fair_dispatch_ahead"
            f"{' auto' if config.dispatch_ahead is None else ''})")


def _ahead_words(setting: int | None) -> str:
    if setting is not None:
        return f"{setting} ahead"
    return f"0 ahead where releases refill, else {AUTO_AHEAD}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


class Reporter:
    """Logs the periodic report (see the module docstring); :meth:`stepped` after each
    step. ``store``: the dispatcher's current store (tests may swap it)."""

    def __init__(self, store: Callable[[], Store], config: FairConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = config.report_interval
        self._store = store
        self._clock = clock
        self._since = clock()
        self._dispatched: Counter[str] = Counter()

    def due_in(self, longest: float) -> float:
        """Seconds until the next report is due, at most ``longest`` (how long the
        dispatcher may sleep without missing it)."""
        if not self.interval:
            return longest
        return max(0.0, min(longest, self._since + self.interval - self._clock()))

    def stepped(self, dispatched: Mapping[str, int], queues: Sequence[str],
                capacities: Mapping[str, Capacity]) -> None:
        """Count what a step dispatched; log a report once an interval has passed."""
        if not self.interval:
            return
        self._dispatched.update(dispatched)
        elapsed = self._clock() - self._since
        if elapsed < self.interval:
            return
        counts, self._dispatched, self._since = self._dispatched, Counter(), self._clock()
        try:
            summaries = self._store().summaries(list(queues))
            for queue in queues:
                doc = summaries.get(queue)
                self._report(queue, json.loads(doc) if doc else None,
                             counts[queue] / elapsed, capacities.get(queue))
        except FairError as exc:  # the step meets the same outage and logs it
            logger.debug("fair report skipped: %s", exc)

    def _report(self, queue: str, summary: dict[str, Any] | None, rate: float,
                capacity: Capacity | None) -> None:
        if summary is None:
            figures = self._store().queue_figures(queue)
            summary = {"inflight": figures.inflight, "delayed": figures.delayed,
                       "held_interactive": figures.held_interactive,
                       "held_background": figures.held_background, "groups": []}
        held = summary["held_interactive"] + summary["held_background"]
        if not (held or summary["inflight"] or summary["delayed"] or rate):
            return  # idle: nothing to say
        waits = [g for g in summary["groups"] if g.get("oldest_wait") is not None]
        top = max(waits, key=lambda g: g["oldest_wait"], default=None)
        # Worker slots and dispatch-ahead apart (summary.Capacity); "?" before it is read.
        slots, ahead = ("?", 0) if capacity is None else capacity
        logger.info("fair report queue=%s dispatched=%.1f/s held=%d delayed=%d "
                    "in_flight=%d/%s ahead=%d oldest_wait=%s top_group=%s top_wait=%s",
                    queue, rate, held, summary["delayed"], summary["inflight"], slots, ahead,
                    _seconds(summary.get("oldest_wait")), top["group"] if top else "-",
                    _seconds(top and top["oldest_wait"]))



def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"
