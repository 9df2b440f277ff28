"""Exceptions raised by celery_fair. Each docstring is the default message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class FairError(Exception):
    """celery_fair failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(FairError):
    """A celery_fair setting is invalid."""


class InvalidGroup(FairError, ValueError):
    """A fairness group name is invalid."""


class InvalidCost(FairError, ValueError):
    """A task cost must be a positive finite number."""


class InvalidLimit(FairError, ValueError):
    """A cap or weight is not a number in its accepted range."""


class UnknownQueue(FairError, ValueError):
    """No fair queue of that name has held a task."""


class InvalidOption(FairError, ValueError):
    """A celery_fair task option is invalid."""


class SingletonDropped(FairError):
    """A task with ``singleton_mode="drop"`` was not held: its singleton key already has
    a task waiting (``singleton.py``). The caller marks it REVOKED."""

    def __init__(self, task_id: str, key: str) -> None:
        super().__init__(f"task {task_id} dropped: singleton key {key!r} already has a task "
                         "waiting (singleton_mode='drop')")
        self.task_id, self.key = task_id, key


class GroupFull(FairError):
    """A fairness group holds as many tasks as its limit allows (fair_group_max_held):
    the task was not held, nothing was written."""

    def __init__(self, message: str | None = None, *, queue: str = "", group: str = "",
                 count: int = 0, limit: int = 0) -> None:
        super().__init__(message or (
            f"group {group!r} is full in fair queue {queue!r}: it holds {count} tasks, "
            f"its limit is {limit} (fair_group_max_held); the task was not held"
            if group else None))
        self.queue, self.group, self.count, self.limit = queue, group, count, limit

    def in_queue(self, queue: str) -> GroupFull:
        """The same refusal, saying which fair queue (a store's policy code knows not)."""
        return GroupFull(queue=queue, group=self.group, count=self.count, limit=self.limit)

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled across processes (a result backend, a pool) with its fields
        return _group_full, (str(self), self.queue, self.group, self.count, self.limit)


def _group_full(message: str, queue: str, group: str, count: int, limit: int) -> GroupFull:
    return GroupFull(message, queue=queue, group=group, count=count, limit=limit)


class StoreError(FairError):
    """The celery_fair store failed."""


class StoreConnectionError(StoreError):
    """The celery_fair store cannot be reached."""


class StoreUnreachable(StoreConnectionError):
    """The celery_fair store cannot be reached: nothing was sent to it."""


class SlotMigrating(StoreUnreachable):
    """A fair queue's Redis Cluster slot is moving to another node (resharding): no
    script of that queue runs until the migration ends (nothing was done)."""


class SchemaOutOfDate(StoreError):
    """The SQL store's schema is missing or not the one this celery_fair expects: run
    `celery -A proj fair migrate`."""


class StoreFull(StoreError):
    """The celery_fair store is out of memory: nothing was written to it."""


class HoldOutcomeUnknown(StoreConnectionError):
    """The celery_fair store's reply to a hold was lost: the task may be held."""


class ReplicationTimeout(StoreError):
    """Fewer replicas than fair_store_replicas acknowledged a write in time: the master
    has it, but a failover may lose it."""

    def __init__(self, message: str | None = None, *, acknowledged: int = 0,
                 wanted: int = 0) -> None:
        super().__init__(message)
        self.acknowledged, self.wanted = acknowledged, wanted

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self),), {"acknowledged": self.acknowledged,
                                          "wanted": self.wanted}


class HoldNotReplicated(ReplicationTimeout, HoldOutcomeUnknown):
    """A hold was written on the master but not acknowledged by fair_store_replicas
    replicas in time: the task is held and runs, unless a failover loses it first. It was
    not published to the broker (that would run it twice when the hold survives)."""


class BulkHoldFailed(FairError):
    """A bulk hold (``fair_bulk``, ``bulk_holds``) failed part way: its first batches
    are held (``held``, their task ids), the failing batch and the ones after it are not
    (``pending``; the failing one may be, after a lost reply). ``retry()`` writes the
    pending messages again, the same ids and bytes, so what the failing batch did hold
    is held once; it raises BulkHoldFailed again if the store fails again. Its cause
    (``__cause__``) is the store's error, or GroupFull."""

    def __init__(self, message: str | None = None, *, held: list[str] | None = None,
                 pending: list[str] | None = None,
                 retry: Callable[[], None] | None = None) -> None:
        super().__init__(message)
        self.held, self.pending = list(held or ()), list(pending or ())
        self._retry = retry

    def retry(self) -> None:
        """Hold the pending messages again (raises BulkHoldFailed when the store fails
        again; a pickled copy, without its messages, raises FairError)."""
        if self._retry is None:
            raise FairError("this BulkHoldFailed does not carry its messages (pickled?)")
        self._retry()

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (str(self),), {"held": self.held, "pending": self.pending,
                                          "_retry": None}


class CorruptMessage(StoreError):
    """A held message could not be decoded."""


class InvalidControl(FairError, ValueError):
    """A control's actor, reason or duration is not valid (``celery_fair.controls``)."""
