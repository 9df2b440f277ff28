"""Reading a group's held messages, a family of the store contract (:class:`~celery_fair.
store.base.Store` inherits it): what ``fair held`` lists and ``fair purge`` removes, in
bounded batches. Reads only, not atomic with what follows (a message listed may be
dispatched before it is acted on; :meth:`Store.cancel` then simply does not find it)."""

from __future__ import annotations

import abc
from dataclasses import dataclass

__all__ = ["HeldMessage", "HeldReads"]


@dataclass(frozen=True)
class HeldMessage:
    """One message waiting in its group: its hold id (the task id, or a copy's suffixed
    id), its class (``'i'``/``'b'``) and its stored value (``envelope.py``'s encoding)."""

    hold_id: str
    klass: str
    value: bytes


class HeldReads(abc.ABC):
    """The messages a group holds in one fair queue."""

    @abc.abstractmethod
    def held_messages(self, queue: str, group: str, limit: int,
                      klass: str | None = None) -> list[HeldMessage]:
        """Up to ``limit`` messages waiting in ``group`` (in ``klass`` only, ``'i'`` or
        ``'b'``, when given): interactive first, each class in pick order (head first).
        Delayed messages (not due yet) and dispatched ones are not listed. ``[]`` for an
        unknown queue or group. Reads only."""
