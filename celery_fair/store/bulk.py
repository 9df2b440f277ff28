"""Holding many messages at once, a family of the store contract (:class:`~celery_fair.
store.base.Store` inherits it): ``hold_many``, what ``FairTask.fair_bulk`` writes with, one
batch of one fair queue per call."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import FairError, InvalidOption
from .models import Placement, check_hold

__all__ = ["HOLD_BATCH", "BulkHolds", "Hold", "check_holds"]

#: The batch size callers of :meth:`BulkHolds.hold_many` use unless told otherwise: big
#: enough that a round trip carries many messages, small enough that one call (on Redis,
#: one script, which blocks the server while it runs) stays in the milliseconds.
HOLD_BATCH = 500


@dataclass(frozen=True)
class Hold:
    """One message of a :meth:`BulkHolds.hold_many` call: what :meth:`Store.hold` takes
    for it (the clock, ``now_ms``, is the call's)."""

    hold_id: str
    value: bytes
    placement: Placement
    due_ms: int = 0


def check_holds(holds: Sequence[Hold]) -> list[Hold]:
    """``holds`` with their placements checked (:func:`check_hold`): what every backend's
    ``hold_many`` calls before it sends or writes anything.

    Raises:
        what :func:`check_hold` raises, its message prefixed with the hold's index in
        ``holds`` (``message 3 of the batch: hold <id>: ...``).
    """
    checked = []
    # A bulk hold's messages share a few placements: each is checked once (by identity:
    # the holds keep them alive, so no id is reused), and a hold whose placement checks
    # out unchanged is kept as it is.
    placements: dict[int, Placement] = {}
    for index, hold in enumerate(holds):
        if not isinstance(hold, Hold):
            raise TypeError(f"message {index} of the batch is a {type(hold).__name__}: "
                            "expected a Hold")
        given = hold.placement
        placement = placements.get(id(given))
        try:
            if placement is None or not isinstance(hold.value, (bytes, bytearray)):
                placement = placements[id(given)] = check_hold(hold.hold_id, hold.value,
                                                               given)
        except FairError as exc:
            raise type(exc)(f"message {index} of the batch: {exc}") from None
        if placement.drop:  # all or nothing: a batch cannot drop one of its messages
            raise InvalidOption(f"message {index} of the batch: hold {hold.hold_id}: "
                                "singleton_mode 'drop' cannot be held in bulk")
        same = placement == given and type(given.cost) is float  # 1 == 1.0: a float
        checked.append(hold if same else
                       Hold(hold.hold_id, hold.value, placement, hold.due_ms))
    return checked


class BulkHolds(abc.ABC):
    """Many holds in one fair queue, in one atomic call."""

    #: The backend remembers each task id's message for ``RESEND_SECONDS`` after its hold
    #: (Redis with fair_store_replicas ≥ 1: ``k_sent``), so the same message sent again is
    #: held once even after it was picked or has run; without it, only while the first is
    #: still held.
    remembers_sent: bool = False

    @abc.abstractmethod
    def hold_many(self, queue: str, holds: Sequence[Hold], now_ms: int) -> list[str]:
        """Atomically keep every one of ``holds`` in ``queue`` as :meth:`Store.hold` would
        keep each, in order, on the clock ``now_ms``: all of them, or none. Callers keep
        a call to a batch (:data:`HOLD_BATCH`): Redis runs it as one script.

        Backpressure counts the batch: a hold whose placement has ``max_held`` is refused
        when its group holds that many messages counting the batch's new ones before it.
        A hold whose very value is already held under its id (a resend, or the same hold
        twice in the batch) is held once and not counted.

        Returns the hold ids used, in the order of ``holds`` (suffixed as
        :meth:`Store.hold` says when another message is held under an id).

        Raises:
            InvalidOption, InvalidGroup, InvalidCost, CorruptMessage: a hold's arguments
                (:func:`check_holds`, naming its index in ``holds``); before anything is
                sent or written, as :meth:`Store.hold`.
            GroupFull: a group has no room for the batch's holds; nothing written.
            StoreUnreachable: nothing was sent (so nothing is held).
            StoreFull: nothing was written.
            StoreError: any other failure (``HoldOutcomeUnknown``: the reply was lost):
                all of the batch may be held, or none. Calling again with the same
                ``holds`` is safe: what is still held under its id with the same value is
                a resend, held once (a message a dispatcher picked in between is held a
                second time, under its own id, unless the backend :attr:`remembers_sent`).
        """
