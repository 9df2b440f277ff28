"""Which fair queues a dispatcher steps next: the woken and the due ones, not all of them.

A step costs a store round trip per queue, so a dispatcher that knows many queues must
not step them all for every wake-up (that made each task cost O(queues)). A queue is
stepped when:

- a wake marker names it (a hold, a release, a worker coming up: ``Store.wait``);
- its last step took a full batch (more is waiting);
- its next delayed message is due, or its capacity changed;
- ``SWEEP_SECONDS`` passed since its last step: leases of dead workers expire without a
  wake-up of their own, and a marker can be lost with a Redis failover.

A queue in which nothing happened for ``PRUNE_SECONDS`` is a candidate for pruning (the
store then checks, atomically, that nothing is left in it). Times are read from the
``clock`` given (monotonic seconds), so tests can move them by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

#: Longest time a known queue goes without a step (seconds).
SWEEP_SECONDS = 1.0
#: Shortest wait for a queue's next delayed message (seconds): a due time that stays in
#: the past (a message promote cannot move) must not spin the loop.
DUE_FLOOR_SECONDS = 0.01
#: How long nothing must happen in a queue before it may be pruned (seconds): dropped from
#: the dispatcher's working set and from the store's set of fair queues. A new hold brings
#: it back.
PRUNE_SECONDS = 3600.0


class StepSchedule:
    """When each queue of a dispatcher's working set is next due, and what woke."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._due: dict[str, float] = {}  # queue -> clock time a step is due (absent: now)
        self._active: dict[str, float] = {}  # queue -> when something last happened in it
        self._woken: set[str] = set()

    def track(self, queues: Iterable[str]) -> None:
        """The working set is ``queues`` now: a new queue counts as active from now."""
        now, current = self.clock(), set(queues)
        for queue in current.difference(self._active):
            self._active[queue] = now
        for queue in set(self._active).difference(current):
            self.drop(queue)

    def drop(self, queue: str) -> None:
        self._due.pop(queue, None)
        self._active.pop(queue, None)
        self._woken.discard(queue)

    def woken(self, queues: Iterable[str]) -> None:
        """Wake markers named ``queues``: step them next (a hold or release happened)."""
        now = self.clock()
        for queue in queues:
            self._woken.add(queue)
            self._active[queue] = now

    def due_now(self, queue: str) -> None:
        self._due.pop(queue, None)

    def everything_due(self) -> None:
        """After a failure: the next step covers every queue (wake-ups may be lost)."""
        self._due.clear()

    def take(self, queues: Sequence[str]) -> list[str]:
        """The queues of ``queues`` to step now; the wake-ups are used up."""
        now = self.clock()
        chosen = [q for q in queues if q in self._woken or self._due.get(q, now) <= now]
        self._woken.clear()
        return chosen

    def stepped(self, queue: str, *, busy: bool, more: bool,
                next_due_in: float | None) -> None:
        """``queue`` was stepped: ``busy`` if it did anything, ``more`` if it took a full
        batch, ``next_due_in`` seconds until its next delayed message is due."""
        now = self.clock()
        if busy:
            self._active[queue] = now
        due = now if more else now + SWEEP_SECONDS
        if next_due_in is not None:
            due = min(due, now + max(next_due_in, DUE_FLOOR_SECONDS))
        self._due[queue] = due

    def timeout(self, queues: Sequence[str], longest: float) -> float:
        """How long to wait for a wake-up before one of ``queues`` is due (0: one is)."""
        now = self.clock()
        soonest = min((self._due.get(q, now) for q in queues), default=now + longest)
        return min(max(soonest - now, 0.0), longest)

    def idle(self) -> list[str]:
        """Queues in which nothing happened for PRUNE_SECONDS."""
        now = self.clock()
        return [q for q, since in self._active.items() if now - since > PRUNE_SECONDS]

    def touch(self, queue: str) -> None:
        """Count ``queue`` as active from now (it was found not empty)."""
        self._active[queue] = self.clock()
