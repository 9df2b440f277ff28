"""Operator controls during the chaos campaign (``--control-interval``, on by default).

While a round's tasks drain and everything else breaks, a thread makes a random control
every ``interval`` seconds or so, through :mod:`celery_fair.controls` as an operator
would: a group paused without an end (resumed by the thread a moment later) or for a
while (the dispatchers lift it), the whole queue paused for a moment, a group boosted for
a while or until unboosted, a group rate-limited (2 to 50 a second, burst 1 or 5) until
the thread sets it back to no rate limit. None of them touches a cap, so the ledger's
caps stay the truth: a control that let a group run above its cap is a cap violation
like any other.

Before a round settles, :meth:`ChaosControls.lift` resumes whatever is paused without an
end, unboosts whatever is boosted without one and lifts every rate limit, read from the
store (so a resume a crash forgot is made again); what has an end must end by itself,
which :meth:`ChaosControls.leftovers` checks at the end of the run. A control refused
because the store is down (a restart, a crash) is counted under ``store_down``; an
unbounded control refused that way may still have been written, so its undoing is kept
due.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from typing import Any, Callable

from celery_fair import controls
from celery_fair.errors import StoreError
from celery_fair.task import store_for

logger = logging.getLogger("bench.chaos")

ACTOR = "chaos"
#: Longest pause or boost with an end, seconds: short, so the rounds drain on time.
LONGEST = 2.0
#: The controls made, each as often as the others.
KINDS = ("pause", "pause_for", "pause_queue", "boost", "boost_for", "rate")
#: Rate limits set: slow enough to throttle a busy group, not to stall a round.
RATES = ("2/s", "10/s", "50/s")


class ChaosControls:
    """Random controls on ``queue``'s ``groups`` while a round drains."""

    def __init__(self, app: Any, queue: str, groups: list[str], rng: random.Random,
                 interval: float) -> None:
        self.app, self.queue, self.groups = app, queue, groups
        # A stream of its own: its thread's draws do not interleave with the campaign's.
        self.rng = random.Random(rng.random())
        self.interval = interval
        self.applied: Counter[str] = Counter()
        self.error: str | None = None  # anything but a store outage: a bug, fails the run
        self._due: list[tuple[float, str, str | None]] = []  # (when, undo, group)
        self._deck: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- during a round ----------------------------------------------------------------

    def start(self) -> None:
        if self.interval <= 0:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="chaos-controls", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.rng.uniform(0.5, 1.5) * self.interval):
                self._undo_due()
                self._one()
        except Exception as exc:  # noqa: BLE001 - reported in the figures, fails the run
            logger.exception("chaos controls stopped")
            self.error = repr(exc)

    def _one(self) -> None:
        group, seconds = self.rng.choice(self.groups), self.rng.uniform(0.3, LONGEST)
        if not self._deck:  # every kind once per KINDS controls, in a random order
            self._deck = self.rng.sample(KINDS, len(KINDS))
        kind = self._deck.pop()
        if kind == "pause":
            self._later(seconds, "resume", group)  # due even if the pause seems refused
            self._apply(kind, lambda: controls.pause(self.app, group, queue=self.queue,
                                                     actor=ACTOR))
        elif kind == "pause_for":
            self._apply(kind, lambda: controls.pause(self.app, group, queue=self.queue,
                                                     for_seconds=seconds, actor=ACTOR))
        elif kind == "pause_queue":  # short: the whole queue waits meanwhile
            self._apply(kind, lambda: controls.pause(self.app, queue=self.queue,
                                                     for_seconds=seconds / 4, actor=ACTOR))
        elif kind == "rate":  # a rate has no end: the thread lifts it a moment later
            rate, burst = self.rng.choice(RATES), self.rng.choice((1, 5))
            self._later(seconds, "unrate", group)
            self._apply(kind, lambda: controls.limit(self.app, group, queue=self.queue,
                                                     rate=rate, burst=burst, actor=ACTOR))
        else:
            timed = kind == "boost_for"
            weight = self.rng.choice((0.5, 2, 5, 20))
            if not timed:
                self._later(seconds, "unboost", group)
            self._apply(kind, lambda: controls.boost(
                self.app, group, weight=weight, queue=self.queue,
                for_seconds=seconds if timed else None, actor=ACTOR))

    def _later(self, seconds: float, undo: str, group: str | None) -> None:
        self._due.append((time.monotonic() + seconds, undo, group))

    def _undo_due(self) -> None:
        now, due = time.monotonic(), self._due
        self._due = [d for d in due if d[0] > now]
        for _, undo, group in (d for d in due if d[0] <= now):
            if not self._undo(undo, group):
                self._later(0, undo, group)  # the store is down: again at the next tick

    def _undo(self, undo: str, group: str | None) -> bool:
        if undo == "resume":
            return self._apply(undo, lambda: controls.resume(self.app, group, queue=self.queue,
                                                             actor=ACTOR))
        if undo == "unrate":
            return self._apply(undo, lambda: controls.limit(self.app, group, queue=self.queue,
                                                            rate=None, actor=ACTOR))
        return self._apply(undo, lambda: controls.unboost(self.app, group, queue=self.queue,
                                                          actor=ACTOR))

    def _apply(self, kind: str, control: Callable[[], Any]) -> bool:
        try:
            control()
        except StoreError as exc:
            logger.info("chaos: control %s refused, the store is down: %s", kind, exc)
            self.applied["store_down"] += 1
            return False
        self.applied[kind] += 1
        return True

    # -- between rounds and at the end -------------------------------------------------

    def lift(self, timeout: float = 60.0) -> None:
        """Resume every pause and end every boost that has no end, as the store has them
        (retried while the store is down, up to ``timeout``)."""
        self._due.clear()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                store = store_for(self.app)
                for group, until in store.pauses(self.queue).items():
                    if until is None:
                        controls.resume(self.app, group or None, queue=self.queue,
                                        actor=ACTOR)
                        self.applied["lifted"] += 1
                for group, (_, until) in store.boosts(self.queue).items():
                    if until is None:
                        controls.unboost(self.app, group, queue=self.queue, actor=ACTOR)
                        self.applied["lifted"] += 1
                for group in _rated(store, self.queue):
                    controls.limit(self.app, group, queue=self.queue, rate=None, actor=ACTOR)
                    self.applied["lifted"] += 1
                return
            except StoreError:
                time.sleep(0.5)
        self.error = self.error or "the controls could not be lifted: the store stayed down"

    def leftovers(self, timeout: float = LONGEST + 5.0) -> int:
        """Pauses and boosts still in force once every end has passed (0: each one with
        an end ended by itself, at a dispatcher's step)."""
        deadline, left = time.monotonic() + timeout, -1
        while time.monotonic() < deadline:
            try:
                store = store_for(self.app)
                left = len(store.pauses(self.queue)) + len(store.boosts(self.queue)) \
                    + len(_rated(store, self.queue))
            except StoreError:
                left = -1
            if left == 0:
                return 0
            time.sleep(0.25)
        return left


def _rated(store: Any, queue: str) -> list[str]:
    """The groups of ``queue`` with a rate limit in force (a runtime "none" is none)."""
    return sorted(g for g, rate in store.rates(queue).items() if rate is not None)
