"""celery_fair: fair scheduling across tenants for Celery.

Mark tasks with :func:`fair_task` (or ``base=FairTask``); their publications are held per
group and a dispatcher (``celery -A proj fair dispatch``) feeds the real queue fairly.
:func:`install` does the same for tasks published by name (``send_task``, beat) that the
``fair_tasks`` setting names; :func:`cancel` (and ``revoke()``) removes a held task.
Importing this package also connects the worker-side receivers that release slots.
"""

from __future__ import annotations

from . import worker as _worker  # noqa: F401  (connects the worker-side signal receivers)
from .bulk import bulk_holds
from .config import FairConfig
from .errors import (
    BulkHoldFailed,
    ConfigurationError,
    FairError,
    GroupFull,
    HoldNotReplicated,
    HoldOutcomeUnknown,
    InvalidControl,
    InvalidCost,
    InvalidGroup,
    InvalidLimit,
    InvalidOption,
    ReplicationTimeout,
    StoreConnectionError,
    StoreError,
    UnknownQueue,
)
from .groups import fair_context
from .installer import install
from .position import Position, position
from .revoke import cancel
from .task import FairTask, fair_task

__all__ = [
    "BulkHoldFailed",
    "ConfigurationError",
    "FairConfig",
    "FairError",
    "FairTask",
    "GroupFull",
    "HoldNotReplicated",
    "HoldOutcomeUnknown",
    "InvalidControl",
    "InvalidCost",
    "InvalidGroup",
    "InvalidLimit",
    "InvalidOption",
    "Position",
    "ReplicationTimeout",
    "StoreConnectionError",
    "StoreError",
    "UnknownQueue",
    "bulk_holds",
    "cancel",
    "fair_context",
    "fair_task",
    "install",
    "position",
]
__version__ = "0.1.0"
