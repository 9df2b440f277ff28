"""Dedicated pools (``fair_group_queues``, issue 14 item 3): the groups whose name matches
a glob pattern go to another real queue, so to the workers consuming it, while they stay
in their fair queue's accounting (the same virtual time, caps, weights).

It rides on affinity routing's machinery (``routing.py``, ``store/routing.py``): the map
names each group's *target*, and the store counts each target's routed dispatches in
flight. A target is a worker's hostname (``fair_affinity`` 'hash') or a real queue,
written ``queue:<name>`` (:func:`target`): Celery's hostnames always hold an ``@``, and
the pick never spills a group to or from a queue target (``include/routing.lua``).
"""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from .config_keys import invalid_setting

__all__ = ["TARGET_PREFIX", "GroupQueues", "dedicated_queue", "group_queues_of", "queue_of",
           "target"]

#: (pattern, real queue) pairs in the order written: the first match wins.
GroupQueues = tuple[tuple[str, str], ...]

#: How a real queue is named among the pick's targets (include/routing.lua knows it too).
TARGET_PREFIX = "queue:"


def group_queues_of(setting: str, value: Any) -> GroupQueues:
    """``fair_group_queues`` as written (``setting``: its name, per queue too), checked:
    a dict of non-empty glob pattern -> non-empty real queue name."""
    if value is None:
        return ()
    expected = ("a dict of {group glob pattern: real queue name}, both non-empty "
                "strings, such as {'vip-*': 'vip'}")
    if not isinstance(value, Mapping):
        raise invalid_setting(setting, value, expected)
    for pattern, name in value.items():
        if not (isinstance(pattern, str) and pattern and isinstance(name, str) and name):
            raise invalid_setting(setting, value, expected)
    return tuple((str(p), str(n)) for p, n in value.items())


def queue_of(rules: GroupQueues, group: str) -> str | None:
    """The real queue ``group``'s tasks go to: the first pattern it matches (case
    sensitive, as group names are), or None."""
    for pattern, name in rules:
        if fnmatchcase(group, pattern):
            return name
    return None


def dedicated(rules: GroupQueues, fair_queue: str) -> list[str]:
    """The real queues ``fair_queue``'s groups may be sent to, besides itself."""
    return sorted({name for _, name in rules if name != fair_queue})


def target(queue: str) -> str:
    """The pick's target for real queue ``queue``."""
    return TARGET_PREFIX + queue


def dedicated_queue(name: str | None) -> str | None:
    """The real queue a target names (None: a worker, or no target)."""
    if name is None or not name.startswith(TARGET_PREFIX):
        return None
    return name[len(TARGET_PREFIX):]
