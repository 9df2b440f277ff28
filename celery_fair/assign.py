"""``fair_assign``: a function of the app's own choosing a group's worker instead of the
consistent hash (``fair_affinity = "hash"``).

It takes ``(group, workers)``, ``workers`` being the live workers of the fair queue as
:class:`AssignWorker` (hostname, started_at, pool, queues) in slot order, and returns
one of their hostnames, or None to leave the group to the hash. Whatever else happens (it
raises, or names a worker that is not live) is logged and the hash decides: a bad
function slows nothing down and loses nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery.utils.imports import symbol_by_name

from .affinity import Slots, owner
from .config_keys import invalid_setting as _fail
from .errors import ConfigurationError

__all__ = ["AssignWorker", "Assigner", "assign_ref", "load_assign"]

logger = logging.getLogger(__name__)

#: ``fair_assign``'s signature.
AssignFunction = Callable[[str, Sequence["AssignWorker"]], "str | None"]


@dataclass(frozen=True)
class AssignWorker:
    """A live worker as ``fair_assign`` sees it."""

    hostname: str
    #: when it joined (its first registration since it was last gone), UTC; None for a
    #: worker of a version before start times
    started_at: datetime | None
    #: its pool size (concurrency)
    pool: int
    #: the fair queues it consumes, as far as this dispatcher knows
    queues: tuple[str, ...]


def assign_ref(value: Any) -> Any:
    """``fair_assign`` checked: None, a callable or a path to one ('module:function' or
    'module.function'); imported later, where the app's modules import."""
    if value is None or callable(value):
        return value
    dotted = value.replace(":", ".") if isinstance(value, str) else ""
    if dotted.count(".") >= 1 and all(part.isidentifier() for part in dotted.split(".")):
        return value
    raise _fail("fair_assign", value, "a function (group, workers) -> hostname or None, "
                                      "or its path ('module:function')")


def load_assign(value: Any) -> AssignFunction | None:
    """The function ``fair_assign`` names (None: the hash alone).

    Raises:
        ConfigurationError: the path does not import, or names something not callable.
    """
    value = assign_ref(value)
    if not isinstance(value, str):
        return value  # type: ignore[no-any-return]
    try:
        found = symbol_by_name(value)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(f"setting fair_assign={value!r} does not import: {exc}") \
            from exc
    if not callable(found):
        raise ConfigurationError(f"setting fair_assign={value!r} names {found!r}: expected "
                                 "a function (group, workers) -> hostname or None")
    return found  # type: ignore[no-any-return]


class Assigner:
    """Owners of groups: ``fair_assign``'s answer where it gives a live worker, else the
    consistent hash over the slot table. Its failures are logged once per burst (the
    first with its traceback, then a count), never raised."""

    def __init__(self, function: AssignFunction | None) -> None:
        self.function = function
        self.failures = 0  # since the last log line

    def owner(self, group: str, table: Slots, workers: Sequence[AssignWorker]) -> str | None:
        """``group``'s worker (None: no live worker)."""
        if self.function is not None and workers:
            chosen = self._chosen(group, workers)
            if chosen is not None:
                return chosen
        return owner(group, table)

    def _chosen(self, group: str, workers: Sequence[AssignWorker]) -> str | None:
        assert self.function is not None
        try:
            chosen = self.function(group, workers)
        except Exception:  # noqa: BLE001 - the app's function must not stop dispatching
            self._failed(group, "raised", exc_info=True)
            return None
        if chosen is None or any(w.hostname == chosen for w in workers):
            return chosen
        self._failed(group, f"returned {chosen!r}, not a live worker of the queue")
        return None

    def _failed(self, group: str, what: str, exc_info: bool = False) -> None:
        self.failures += 1
        if self.failures == 1:
            logger.warning("fair_assign %s for group %r; the group goes by the hash "
                           "(further failures are counted)", what, group, exc_info=exc_info)

    def report(self) -> None:
        """Log how many groups fell back to the hash since the last report."""
        if self.failures > 1:
            logger.warning("fair_assign failed for %d groups; they go by the hash",
                           self.failures)
        self.failures = 0
