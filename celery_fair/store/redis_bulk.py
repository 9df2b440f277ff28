"""Holding on Redis: ``hold`` and ``hold_many`` and their error story (``hold_many.lua``:
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
from .connection import Taken, _explained, _text, _wrapped
from .models import Placement, check_hold


class RedisBulk:
    """A mixin of :class:`~celery_fair.store.redis.RedisStore` (it gives the round
    trips)."""

    where: str
    keys: Any
    client: Any
    _lane: Any
    _pipelined: Any

    def hold(self, queue: str, hold_id: str, value: bytes, placement: Placement, due_ms: int,
             now_ms: int) -> str:
        """See :meth:`Store.hold`; a lost reply raises :class:`HoldOutcomeUnknown`. The
        same message sent again within :attr:`resend_seconds` is held once (hold.lua).

        The queue is registered on every hold, in the same round trip: should the set
        lose it (a partial flush, a failover), the next hold puts it back, and the
        dispatchers and `fair check` find the queue again."""
        p = check_hold(hold_id, value, placement)
        args = [hold_id, value, due_ms, now_ms, p.group, p.klass, p.cost, int(p.front),
                "" if p.max_held is None else p.max_held, self.resend_seconds,
                p.singleton or "", "drop" if p.drop else ""]
        with self.holding(queue, "hold") as taken:
            [held] = self._pipelined(self.keys(queue).prefix, [("hold", args)],
                                     register=queue, replicate=True, taken=taken)
        return _text(held)

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
                     "" if p.max_held is None else p.max_held, p.singleton or ""]
        with self.holding(queue, "hold_many") as taken:
            [held] = self._pipelined(self.keys(queue).prefix, [("hold_many", args)],
                                     register=queue, replicate=True, taken=taken)
        return [_text(h) for h in held]

    def _connect(self, key: str) -> Taken | None:
        """Take a connected connection (the lane's, connecting if need be), before
        sending anything, for the round trip to send on (:class:`Taken`). redis-py raises
        the same ConnectionError for a server it cannot connect to and for a reply lost
        after the command was sent (and resent: its retries end at connect); failing here
        is the only certain "not sent". (``key``: where the command goes, on a
        cluster.)"""
        return Taken(self._lane.give, self._lane.connected())

    @contextmanager
    def holding(self, queue: str, operation: str) -> Iterator[Taken | None]:
        """Around a hold's round trip: connect first (failing there is the only certain
        "not sent": :class:`StoreUnreachable`), yielding the connection taken for the
        round trip (put back unless it was used); a reply lost is
        :class:`HoldOutcomeUnknown`, a ``WAIT`` short of the replicas
        :class:`HoldNotReplicated` (the master has it)."""
        with _wrapped(self.where, unreachable=StoreUnreachable):
            taken = self._connect(self.keys(queue).prefix)
        try:
            with _explained(operation, queue):
                yield taken
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
        finally:
            if taken is not None:
                taken.put_back()
