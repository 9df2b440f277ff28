"""Which scheduling policy each fair queue runs: ``fair_policy`` and its companions, set
app-wide and overridden per fair queue by ``fair_queue_policies``.

A :class:`PolicyChoice` is everything that selects a queue's behaviour; each companion
setting is one of its fields and one entry of :data:`COMPANIONS` (its validator), so a
later companion (``fair_charge``, ``fair_cap_mode``...) is a field, a validator and a
``Setting`` in ``settings.py``, and ``fair_queue_policies`` takes it per queue at once.
Everything is validated when the settings are read (``config.py``), before a dispatcher
writes anything, with errors naming the setting, the bad value and what is expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Callable

from .config_keys import invalid_setting as _fail
from .errors import ConfigurationError
from .limits import CHARGES, COST, HARMONY, POLICIES, WFQ

__all__ = ["CHARGES", "COMPANIONS", "HARMONY", "POLICIES", "WFQ", "PolicyChoice", "read_policies"]


@dataclass(frozen=True)
class PolicyChoice:
    """The behaviour selected for one fair queue."""

    #: ``fair_policy``: 'wfq' (weighted start-time fair queueing) or 'harmony' (fewest
    #: tasks in flight first)
    name: str = WFQ
    #: ``fair_charge``: what a dispatch charges a group's share under 'wfq': 'cost' (its
    #: declared cost), 'count' (1 per task) or 'runtime' (the wall time it ran)
    charge: str = COST


def _policy_name(setting: str, value: Any) -> str:
    if value not in POLICIES:
        raise _fail(setting, value, "one of " + ", ".join(repr(p) for p in POLICIES))
    return str(value)


def _charge(setting: str, value: Any) -> str:
    if value not in CHARGES:
        raise _fail(setting, value, "one of " + ", ".join(repr(c) for c in CHARGES))
    return str(value)


#: Companion setting -> (PolicyChoice field, validator(setting as written, value)).
COMPANIONS: Mapping[str, tuple[str, Callable[[str, Any], Any]]] = {
    "fair_policy": ("name", _policy_name),
    "fair_charge": ("charge", _charge),
}


def read_policies(get: Callable[[str], Any], declared: Callable[[], set[str]]
                  ) -> tuple[PolicyChoice, dict[str, PolicyChoice]]:
    """The app-wide choice (the companions' settings) and the per-queue ones
    (``fair_queue_policies``: each queue's entries laid over the app-wide choice).
    ``declared``: the queues the app declares (``queues.declared_queues``), asked only
    when there are per-queue entries (it prepares the app's routers).

    Raises:
        ConfigurationError: an unknown policy, a queue the app does not declare, an
            entry that is not a companion setting.
    """
    base = PolicyChoice(**{field: check(name, get(name))
                           for name, (field, check) in COMPANIONS.items()})
    per_queue = get("fair_queue_policies")
    if not isinstance(per_queue, Mapping):
        raise _fail("fair_queue_policies", per_queue,
                    "a dict of {queue: {'fair_policy': ...}}")
    queues: dict[str, PolicyChoice] = {}
    known = declared() if per_queue else set()
    for queue, entries in per_queue.items():
        where = f"fair_queue_policies[{queue!r}]"
        if queue not in known:
            raise ConfigurationError(
                f"setting fair_queue_policies has an unknown queue {queue!r}: expected a "
                "queue the app declares (task_default_queue, task_queues or a task_routes "
                f"mapping): {', '.join(map(repr, sorted(known)))}")
        queues[queue] = _laid_over(base, where, entries)
    return base, queues


def _laid_over(base: PolicyChoice, where: str, entries: Any) -> PolicyChoice:
    """One queue's entry of fair_queue_policies (``where``) laid over ``base``."""
    if not isinstance(entries, Mapping):
        raise _fail(where, entries, "a dict of companion settings, such as "
                                    "{'fair_policy': 'harmony'}")
    changes = {}
    for key, value in entries.items():
        if key not in COMPANIONS:
            raise ConfigurationError(f"setting {where} has an unknown key {key!r}: expected "
                                     "one of " + ", ".join(repr(k) for k in COMPANIONS))
        field, check = COMPANIONS[key]
        changes[field] = check(f"{where}[{key!r}]", value)
    return replace(base, **changes)
