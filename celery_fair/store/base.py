"""The store contract: every state change of a held message is one atomic operation.

The store deals in stored values (bytes, see ``envelope.py``) and ids only; Celery and
kombu stay in ``holding.py`` and ``publisher.py``. All times are milliseconds since the epoch
passed in by the caller, so the operations are deterministic and testable.

:class:`Store` groups its methods in families: the lifecycle of a held message, the
policy, wake-ups, reads and maintenance; and families in mixins of their own: the
worker registry (``registry.py``), heartbeats (``beats.py``), the audit log
(``audit.py``), pauses (``pausing.py``), boosts (``boosting.py``), rate limits and
throttles (``throttling.py``), head waits (``heads.py``), held messages (``held.py``),
many holds (``bulk.py``), the direct push (``pushing.py``). Every one may raise
:class:`~celery_fair.errors.StoreError` (or a subclass: ``StoreConnectionError`` when the
store cannot be reached, ``StoreUnreachable`` when nothing was sent, ``StoreFull``); the
docstrings name the others and what a resend does (a client resends a call whose reply a
dropped connection lost). Optional speed-ups are capabilities a backend declares
(:attr:`~.pushing.DirectPushing.supports_direct_push`).
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .audit import Audit
from .beats import Beats
from .boosting import Boosting
from .bulk import BulkHolds
from .heads import HeadWaits
from .held import HeldReads
from .models import (
    CANCELLED_SECONDS,
    CHECK_BATCH,
    KEEP,
    PLACEMENT_CLASSES,
    PRUNE_GRACE_MS,
    QUARANTINE_MAX,
    RATE_EARLY_MS,
    RESET,
    TOMBSTONE_SECONDS,
    BeginAnswer,
    BeginResult,
    DirectPush,
    DispatcherBeat,
    GroupFigures,
    GroupHeads,
    Location,
    Picked,
    Place,
    Placement,
    Policy,
    Pushed,
    QueueFigures,
    as_json,
    busiest_first,
    check_hold,
    limited_by,
    now_ms,
    snapshot_of,
    wall_clock_ms,
)
from .pausing import Pausing
from .pushing import DirectPushing
from .registry import Registry
from .routing import Routing
from .throttling import Throttling

__all__ = ["CANCELLED_SECONDS", "CHECK_BATCH", "KEEP", "PLACEMENT_CLASSES", "PRUNE_GRACE_MS",
           "QUARANTINE_MAX", "RATE_EARLY_MS", "RESET", "TOMBSTONE_SECONDS", "BeginAnswer",
           "BeginResult", "DirectPush", "DispatcherBeat", "GroupFigures", "GroupHeads",
           "Location", "Picked", "Place", "Placement", "Policy", "Pushed", "QueueFigures",
           "Store", "as_json", "busiest_first", "check_hold", "limited_by", "now_ms",
           "snapshot_of"]


class Store(Registry, BulkHolds, Beats, HeadWaits, HeldReads, Audit, Pausing, Boosting,
            Throttling, Routing, DirectPushing):
    """Holding queues, fair picking and dispatch leases for the fair queues of one app."""

    #: The namespace of the app's fair queues in the store (``fair_key_prefix``).
    namespace: str
    #: Where the store is, safe to log (no password).
    where: str
    #: The store outlives the worker's process (not the in-process memory store): a
    #: task's release is then written ahead to the spool (lifecycle.release_dispatch).
    outlives_process: bool = True

    # -- lifecycle: hold, pick, confirm, begin, renew, release, reclaim, promote, ... ------

    @abc.abstractmethod
    def hold(self, queue: str, hold_id: str, value: bytes, placement: Placement, due_ms: int,
             now_ms: int) -> str:
        """Atomically keep ``value`` in ``placement``'s group and class (at its head when
        ``placement.front``; in the delayed set until ``due_ms`` when that is after
        ``now_ms``). The placement comes as an argument: the contract never parses
        ``value``, which it keeps and hands back byte for byte (``envelope.py``'s
        encoding, whose prefix repeats the placement for the Redis scripts' later reads).

        Returns the hold id used: ``hold_id``, suffixed when a message with that id is
        already held (nothing is ever overwritten: another message, a retry, is a copy
        that runs). The same value under the same id again is a resend: held once (where
        :attr:`remembers_sent`: its hold time aside, even after it was picked).

        Raises:
            InvalidOption: ``placement`` is not a :class:`Placement`, or its class is not
                ``'i'``/``'b'`` or its front flag not a bool (:func:`check_hold`, before
                anything is sent or written; the message names ``hold_id``).
            InvalidGroup: the placement's group is not a group name (likewise).
            InvalidCost: the placement's cost is out of range (likewise).
            CorruptMessage: ``value`` is not bytes (likewise); or, in a backend that reads
                the placement back from the value later (Redis), the value's prefix is not
                ``envelope.py``'s encoding of ``placement``; nothing was written.
            StoreUnreachable: nothing was sent (so nothing is held).
            StoreFull: nothing was written (so nothing is held).
            StoreError: any other failure; the message may be held (a reply lost).
        """

    @abc.abstractmethod
    def pick(self, queue: str, limit: int, capacity: int | None, now_ms: int,
             lease_ms: int, *, token: str | None = None) -> list[Picked]:
        """Atomically take up to ``limit`` messages in fair order, without exceeding
        ``capacity`` in-flight dispatches or any group's cap; each becomes a 'picked'
        dispatch with a lease of ``lease_ms``. Two concurrent picks never return the same
        message and dispatch ids never repeat (``token`` prefixes them; generated when
        None). Not idempotent: a resend picks more (their leases run out and
        :meth:`reclaim` holds them again). Returns the picked messages, in order."""

    def pick_and_push(self, queue: str, limit: int, capacity: int | None, now_ms: int,
                      lease_ms: int, push: DirectPush | None, queued_deadline_ms: int,
                      *, token: str | None = None) -> tuple[list[Pushed], list[Picked]]:
        """:meth:`pick`; with ``push`` (only when :attr:`supports_direct_push`) the store
        itself pushes what it can into the broker's list, those dispatches 'queued' at once
        until ``queued_deadline_ms``. Returns what it pushed and what is left for the
        caller to publish. A backend without direct push picks only (this default)."""
        return [], self.pick(queue, limit, capacity, now_ms, lease_ms, token=token)

    def promote_reclaim_pick(self, queue: str, now_ms: int, limit: int,
                             capacity: int | None, lease_ms: int, push: DirectPush | None,
                             queued_deadline_ms: int, reclaim: bool = True
                             ) -> tuple[tuple[int, int | None], tuple[int, int],
                                        tuple[list[Pushed], list[Picked]]]:
        """:meth:`promote`, :meth:`reclaim` (when ``reclaim``) and :meth:`pick_and_push`
        in this order, in one round trip where the backend can: each step atomic, not the
        three together. Returns their three answers (this default: three calls)."""
        moved = self.promote(queue, now_ms, 1000)
        taken = self.reclaim(queue, now_ms, 1000) if reclaim else (0, 0)
        return moved, taken, self.pick_and_push(queue, limit, capacity, now_ms, lease_ms,
                                                push, queued_deadline_ms)

    @abc.abstractmethod
    def confirm(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> list[str]:
        """Atomically mark dispatches the broker accepted 'queued' with a lease until
        ``deadline_ms``. Idempotent. Returns the stale ones (superseded, lost or gone)."""

    def begin(self, queue: str, dispatch_id: str, deadline_ms: int, *,
              now_ms: int | None = None, run: str | None = None, acks_late: bool = False,
              host: str = "", gone: Callable[[str], bool] | None = None) -> BeginResult:
        """A worker is about to run a dispatch: mark it running, say whether to run it.

        ``run`` names this run (unique; generated when None): a copy of the dispatch that
        another run is running under a live lease is skipped when ``acks_late`` runs keep
        the message with the record, since reclaim can then hold it again should that run
        die. When that run's token starts with ``host`` (this machine's), ``gone(token)``
        says whether it has ended without a word (its pool process was killed): then
        this run takes it over at once. ``now_ms`` is the clock the lease is judged by.

        Up to three atomic calls (:meth:`begin_run`, then :meth:`take_over` or
        :meth:`begin_run` without a host); ``gone`` runs between them, outside any
        transaction, so a transactional backend can honour it.

        Returns:
            What to do with the delivered copy (:class:`BeginResult`).
        """
        now = wall_clock_ms() if now_ms is None else now_ms
        run = run or uuid.uuid4().hex
        answer = self.begin_run(queue, dispatch_id, deadline_ms, now_ms=now, run=run,
                                acks_late=acks_late, host=host if gone else "")
        if answer.held_by and gone is not None and gone(answer.held_by):
            answer = self.take_over(queue, dispatch_id, deadline_ms, now_ms=now, run=run,
                                    acks_late=acks_late, host=host, token=answer.held_by)
        if answer.result is None:  # a live run holds it (or another took over): a copy
            answer = self.begin_run(queue, dispatch_id, deadline_ms, now_ms=now, run=run,
                                    acks_late=acks_late)
        return BeginResult.SKIP if answer.result is None else answer.result

    @abc.abstractmethod
    def begin_run(self, queue: str, dispatch_id: str, deadline_ms: int, *, now_ms: int,
                  run: str, acks_late: bool, host: str = "") -> BeginAnswer:
        """One atomic step of :meth:`begin`: mark the dispatch running under ``run`` and
        answer its :class:`BeginResult`; or, when a run whose token starts with ``host``
        (non-empty) holds it under a live lease, change nothing and answer that run's
        token (``held_by``). A resend with the same ``run`` answers as the first did."""

    @abc.abstractmethod
    def take_over(self, queue: str, dispatch_id: str, deadline_ms: int, *, now_ms: int,
                  run: str, acks_late: bool, host: str, token: str) -> BeginAnswer:
        """:meth:`begin_run` for a dispatch the run ``token`` held, judged gone by the
        caller: ``run`` takes it over unless another run took it over meanwhile (then
        that run's token is answered)."""

    @abc.abstractmethod
    def renew(self, queue: str, dispatch_ids: Iterable[str], deadline_ms: int) -> int:
        """Extend leases of dispatches a worker holds to ``deadline_ms``. Idempotent.
        Returns how many were current."""

    @abc.abstractmethod
    def release(self, queue: str, dispatch_id: str, done_seconds: int = 0,
                run: str | None = None, runtime: float | None = None,
                now_ms: int | None = None) -> bool:
        """Free a dispatch's slot (atomic, idempotent); whether one was freed. With
        ``done_seconds`` (it ran to its end) a 'released' tombstone that long skips a
        redelivered copy; with ``run``, only while that run holds it; with ``runtime``
        (seconds it ran), a dispatch charged an estimate corrects it (``fair_charge``).
        A dispatch with a singleton key passes it to the key's next waiting message,
        whose head time is ``now_ms`` (None: the store's clock)."""

    @abc.abstractmethod
    def reclaim(self, queue: str, now_ms: int, limit: int) -> tuple[int, int]:
        """Take back up to ``limit`` slots whose lease ran out: a dispatch no worker
        reported (picked or queued) is held again, one a worker had is lost with it (the
        broker redelivers). Each slot atomically; a resend finds nothing more to do.
        Returns (held again, lost to a dead worker)."""

    @abc.abstractmethod
    def promote(self, queue: str, now_ms: int, limit: int) -> tuple[int, int | None]:
        """Move up to ``limit`` due delayed messages into their groups, and lift up to
        ``limit`` throttles that end by ``now_ms`` (atomic; idempotent). Returns (moved,
        next due ms or None): when the next delayed message is due or the next throttle
        is to be lifted, whichever comes first."""

    @abc.abstractmethod
    def cancel(self, queue: str, task_ids: Iterable[str], *, token: str | None = None,
               now_ms: int | None = None) -> list[tuple[str, bytes]]:
        """Remove the held or delayed messages of ``task_ids`` (their tasks were revoked
        before running), including copies held under a suffixed hold id
        (``<task id>~<n>``: the same id held twice). The removal is atomic; a message
        already picked, queued or running is left alone. ``token`` names the call: a
        resend within :data:`CANCELLED_SECONDS` gets the first answer again, so what it
        removed is never lost with a reply. A head removed stamps its group's next head
        ``now_ms`` (default: now). Returns ``(hold id, stored value)`` of each removed."""

    @abc.abstractmethod
    def quarantine(self, queue: str, dispatch_id: str, value: bytes, reason: str) -> None:
        """Keep an undecodable message aside (never dropped: for a human to look at) and
        free its slot. Idempotent: a resend keeps one entry. The quarantine keeps the
        newest :data:`QUARANTINE_MAX` entries (each one dropped is logged)."""

    # -- policy ----------------------------------------------------------------------

    @abc.abstractmethod
    def configure(self, queue: str, policy: Policy) -> None:
        """Atomically store the queue's policy settings and re-rank its groups under them.
        Idempotent.

        Raises:
            InvalidLimit: a number of ``policy`` is out of range; nothing was written.
        """

    @abc.abstractmethod
    def limit(self, queue: str, group: str, cap: int | str = KEEP,
              weight: float | str = KEEP) -> tuple[int | None, float]:
        """Set (:data:`RESET`: clear; :data:`KEEP`: leave) ``group``'s runtime cap and weight;
        they take precedence over the settings and survive restarts (cap -1: none, 0:
        paused). Atomic and idempotent. Returns the cap (None: none) and weight in force.

        Raises:
            InvalidGroup: ``group`` is not a group name; nothing was written.
            InvalidLimit: ``cap`` or ``weight`` is out of range; nothing was written.
        """

    @abc.abstractmethod
    def queues(self) -> list[str]:
        """Every fair queue that has held a message, sorted."""

    @abc.abstractmethod
    def forget_queue(self, queue: str) -> bool:
        """Atomically drop ``queue`` from :meth:`queues` if nothing is held, delayed, in
        flight or quarantined in it; True when dropped. A later hold adds it again."""

    # -- wake-ups -------------------------------------------------------------------

    @abc.abstractmethod
    def wait(self, queues: Iterable[str], timeout: float) -> set[str]:
        """Block until a hold, release or new worker wakes one of ``queues`` or
        ``timeout`` (seconds) passes. Returns the woken queues (empty on timeout); with
        ``timeout`` 0 it only looks, without blocking. A wake-up may be spurious."""

    # -- reads (not atomic across calls; for status, metrics and dashboards) ----------

    @abc.abstractmethod
    def queue_figures(self, queue: str) -> QueueFigures:
        """Totals of ``queue`` in O(1), from the store's counters."""

    @abc.abstractmethod
    def group_figures(self, queue: str, groups: Sequence[str]) -> list[GroupFigures]:
        """Figures of each of ``groups``, in their order (a group without work: zeros)."""

    @abc.abstractmethod
    def top_groups(self, queue: str, limit: int) -> list[tuple[str, int]]:
        """The ``limit`` groups holding the most messages, most first, with their count."""

    @abc.abstractmethod
    def busiest_groups(self, queue: str, limit: int) -> list[GroupFigures]:
        """Figures of at most ``limit`` groups with work, most held first, then most in
        flight, then by name (:func:`busiest_first`); O(limit) reads."""

    @abc.abstractmethod
    def summarize(self, queue: str, groups: Sequence[str]) -> list[GroupHeads]:
        """Counts and head due times of ``groups``, in their order."""

    def loads(self, queues: Sequence[str]) -> dict[str, tuple[int, int]]:
        """{queue: (in flight, held)} of ``queues`` (this default: their figures)."""
        out = {}
        for queue in queues:
            figures = self.queue_figures(queue)
            out[queue] = (figures.inflight, figures.held)
        return out

    @abc.abstractmethod
    def dispatch_state(self, queue: str, dispatch_id: str) -> str | None:
        """State of a dispatch (picked, queued, running, lost, superseded; 'released'
        while its tombstone lasts), None when the store does not know it."""

    @abc.abstractmethod
    def locate(self, task_id: str) -> Location | None:
        """Where ``task_id`` stands in any fair queue, None when the store neither holds
        nor tracks it (never published fair, or finished)."""

    @abc.abstractmethod
    def snapshot(self, queue: str) -> dict[str, Any]:
        """Totals and every group's figures as one document (:func:`snapshot_of`):
        O(groups), for tests and tools."""

    # -- the summaries dashboards read (written by one dispatcher at a time) ------------

    @abc.abstractmethod
    def claim_writer(self, queue: str, ms: int) -> bool:
        """Atomically claim writing ``queue``'s summary for ``ms``; False while another
        dispatcher's claim lasts (so the work is not repeated)."""

    @abc.abstractmethod
    def put_summary(self, queue: str, doc: str, ttl_seconds: int) -> None:
        """Store ``queue``'s summary document (JSON); it lapses after ``ttl_seconds``
        unless written again. Idempotent."""

    @abc.abstractmethod
    def summaries(self, queues: Sequence[str]) -> dict[str, str | None]:
        """The summary documents of ``queues`` (None where none is live)."""

    # -- maintenance ----------------------------------------------------------------

    @abc.abstractmethod
    def check(self, queue: str, repair: bool, now_ms: int, lease_ms: int, *,
              batch: int = CHECK_BATCH) -> list[tuple[str, str, str, str]]:
        """Check (with ``repair``, fix) ``queue``'s invariants, in atomic steps of about
        ``batch`` entries, safe beside running dispatchers and workers. Returns ``(kind,
        subject, detail, action)`` per finding; ``action`` is empty when nothing was
        done."""

    def check_scope(self, repair: bool, *, batch: int = CHECK_BATCH
                    ) -> list[tuple[str, str, str, str]]:
        """``fair_scope`` 'app' (``scope_check.py``): each group's in-flight count over
        the app-scoped queues against the sum of their own counts (with ``repair``, set to
        it), and wfq charge totals of groups no app-scoped queue knows (deleted). Same
        findings as :meth:`check`, for the namespace; none where the scope is not
        supported."""
        return []

    @abc.abstractmethod
    def flush(self) -> None:
        """Delete everything of this store's namespace but the workers' registrations
        and the dispatchers' heartbeats (the pytest plugin's cleanup between tests: a
        session's processes outlive it). Never called in production."""

    @abc.abstractmethod
    def advice(self) -> list[str]:
        """Settings of the server under the store that can lose held tasks, one sentence
        each (empty: none known)."""

    @abc.abstractmethod
    def ping(self) -> None:
        """Raise :class:`~celery_fair.errors.StoreConnectionError` unless the store
        answers."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connections (idempotent)."""
