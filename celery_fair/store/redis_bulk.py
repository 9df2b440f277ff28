"""Holding on Redis: the error story of ``hold`` and ``hold_many`` (``hold_many.lua``:
one script per batch, so a batch is atomic and, its keys sharing the fair queue's hash
tag, goes to one Cluster slot)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..errors import (
    HoldNotReplicated,
    HoldOutcomeUnknown,
    ReplicationTimeout,
    StoreConnectionError,
    StoreUnreachable,
)
from .bulk import Hold, check_holds
from .connection import _explained, _text, _wrapped


class RedisBulk:
    """A mixin of :class:`~celery_fair.store.redis.RedisStore` (it gives the round
    trips)."""

    where: str
    keys: Any
    _connect: Any
    _pipelined: Any

    @property
    def resend_seconds(self) -> int:
        """RedisStore's (how long hold_many.lua remembers each task id's message)."""
        raise NotImplementedError

    def hold_many(self, queue: str, holds: Sequence[Hold], now_ms: int) -> list[str]:
        """See :meth:`Store.hold_many`: one ``hold_many.lua`` call; a lost reply raises
        :class:`HoldOutcomeUnknown`."""
        checked = check_holds(holds)
        if not checked:
            return []
        args: list[Any] = [now_ms, self.resend_seconds]
        for h in checked:
            p = h.placement
            args += [h.hold_id, h.value, h.due_ms, p.group, p.klass, p.cost, int(p.front),
                     "" if p.max_held is None else p.max_held]
        with self.holding(queue, "hold_many"):
            [held] = self._pipelined(self.keys(queue).prefix, [("hold_many", args)],
                                     register=queue, replicate=True)
        return [_text(h) for h in held]

    @contextmanager
    def holding(self, queue: str, operation: str) -> Iterator[None]:
        """Around a hold's round trip: connect first (failing there is the only certain
        "not sent": :class:`StoreUnreachable`); a reply lost is
        :class:`HoldOutcomeUnknown`, a ``WAIT`` short of the replicas
        :class:`HoldNotReplicated` (the master has it)."""
        with _wrapped(self.where, unreachable=StoreUnreachable):
            self._connect(self.keys(queue).prefix)
        try:
            with _explained(operation, queue):
                yield
        except ReplicationTimeout as exc:
            raise HoldNotReplicated(
                f"{exc}; the task is held on the master (it runs when dispatched) unless a "
                "failover loses it first, so it was not published to the broker",
                acknowledged=exc.acknowledged, wanted=exc.wanted) from None
        except StoreUnreachable:
            raise  # refused unrun (a cluster slot migrating): not held
        except StoreConnectionError as exc:
            raise HoldOutcomeUnknown(
                f"{exc}; the hold's outcome is unknown: the task may be held (it then runs "
                "when dispatched), so it was not published to the broker") from exc.__cause__
