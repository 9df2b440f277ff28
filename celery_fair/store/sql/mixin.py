"""What :class:`~celery_fair.store.sql.store.SqlStore` gives the mixins of its contract
families (``pausing.py``, ``boosting.py``, ``throttling.py``): its statements and
namespace, the wake-ups, and ``_do`` (one transaction) with ``_wake_if``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .statements import Statements


class SqlMixin:
    """The store's parts a family's mixin uses (declared here, given by the store)."""

    s: Statements
    namespace: str
    wakes: Any
    _do: Callable[..., Any]
    _wake_if: Callable[[str, bool], None]
