"""celery_fair: fair scheduling across tenants for Celery.

Mark tasks with :func:`fair_task` (or ``base=FairTask``); their publications are held per
group and a dispatcher (``celery -A proj fair dispatch``) feeds the real queue fairly.
Importing this package also connects the worker-side receivers that release slots.
"""

from __future__ import annotations

from . import worker as _worker  # noqa: F401  (connects the worker-side signal receivers)
from .config import FairConfig
from .errors import (
    ConfigurationError,
    FairError,
    InvalidCost,
    InvalidGroup,
    InvalidOption,
    StoreError,
)
from .groups import fair_context
from .task import FairTask, fair_task

__all__ = [
    "ConfigurationError",
    "FairConfig",
    "FairError",
    "FairTask",
    "InvalidCost",
    "InvalidGroup",
    "InvalidOption",
    "StoreError",
    "fair_context",
    "fair_task",
]
__version__ = "0.1.0"
