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
from .errors import ConfigurationError, InvalidLimit
from .group_queues import GroupQueues, group_queues_of
from .limits import (
    CAP_MODES,
    CHARGES,
    COST,
    DEFAULT_AGING,
    HARD,
    HARMONY,
    NO_SUBGROUP,
    PATH_SUBGROUP,
    POLICIES,
    QUEUE_SCOPE,
    SCOPES,
    SMALLEST,
    SOFT,
    SUBGROUPS,
    WFQ,
)
from .limits import aging as _aging_in_range
from .limits import interactive_share as _share_in_range
from .limits import subgroup as _subgroup_with

#: fair_affinity's values: no routing, or each group to one worker by consistent hash.
NO_AFFINITY, HASH_AFFINITY = "none", "hash"
AFFINITIES = (NO_AFFINITY, HASH_AFFINITY)

__all__ = ["AFFINITIES", "CAP_MODES", "CHARGES", "COMPANIONS", "HARD", "HARMONY",
           "HASH_AFFINITY", "NO_AFFINITY", "NO_SUBGROUP", "PATH_SUBGROUP", "POLICIES", "SCOPES",
           "SMALLEST", "SOFT", "SUBGROUPS", "WFQ",
           "PolicyChoice", "any_affinity", "read_policies", "routes"]


@dataclass(frozen=True)
class PolicyChoice:
    """The behaviour selected for one fair queue."""

    #: ``fair_policy``: 'wfq' (weighted start-time fair queueing), 'harmony' (fewest
    #: tasks in flight first) or 'smallest' (wfq's group order, the smallest declared
    #: cost first inside a group, aged by ``aging_seconds``)
    name: str = WFQ
    #: ``fair_charge``: what a dispatch charges a group's share under 'wfq': 'cost' (its
    #: declared cost), 'count' (1 per task) or 'runtime' (the wall time it ran)
    charge: str = COST
    #: ``fair_cap_mode``: 'hard' (a group at its cap waits) or 'soft' (it may go on while
    #: no other group has work waiting)
    cap_mode: str = HARD
    #: ``fair_interactive_share``: the most of the capacity interactive work may hold
    #: while background work waits (None: strict priority)
    interactive_share: float | None = None
    #: ``fair_aging_seconds``: under 'smallest', the seconds of waiting worth one unit of
    #: declared cost (a task of cost c ranks as if it had come c times this later)
    aging_seconds: float = DEFAULT_AGING
    #: ``fair_affinity``: 'none', or 'hash' (each group's tasks go to one live worker's
    #: own queue, picked by consistent hashing: routing.py)
    affinity: str = NO_AFFINITY
    #: ``fair_affinity_spill_seconds``: how long a group's head waits for its own
    #: worker's free slot before any worker with room takes it (None: it waits)
    spill_seconds: float | None = None
    #: ``fair_group_queues``: (group glob pattern, real queue) pairs, first match wins:
    #: the matching groups' tasks go to that real queue (group_queues.py)
    group_queues: GroupQueues = ()
    #: ``fair_subgroup``: 'none', or 'path' (a group named "acme/alice" is held in the
    #: group "acme" as its subgroup "alice"; inside a group the subgroups take turns)
    subgroup: str = NO_SUBGROUP
    #: ``fair_scope``: 'queue' (a group's cap counts its dispatches of this queue), or
    #: 'app' (its dispatches in flight in every fair queue of the app whose scope is
    #: 'app': the cap applies once across them)
    scope: str = QUEUE_SCOPE

    def describe(self) -> str:
        """The policy with its companions where they are not the default, as ``fair
        status`` and the dispatcher's start line show it: 'wfq', 'wfq, charge runtime',
        'wfq, soft-cap', 'harmony, i≤0.8', 'wfq, charge count, soft-cap, i≤0.8',
        'smallest, aging 1s' (a charge only under 'wfq' and 'smallest': Harmony charges
        nothing; the aging, always, only under 'smallest', the bound depends on it)."""
        parts = [self.name]
        if self.name != HARMONY and self.charge != COST:
            parts.append(f"charge {self.charge}")
        if self.name == SMALLEST:
            parts.append(f"aging {self.aging_seconds:g}s")
        if self.subgroup != NO_SUBGROUP:
            parts.append(f"subgroup {self.subgroup}")
        if self.scope != QUEUE_SCOPE:
            parts.append(f"scope {self.scope}")
        if self.cap_mode != HARD:
            parts.append(f"{self.cap_mode}-cap")
        if self.interactive_share is not None:
            parts.append(f"i≤{self.interactive_share:g}")
        if self.affinity != NO_AFFINITY:
            spill = "" if self.spill_seconds is None else f" spill {self.spill_seconds:g}s"
            parts.append(f"affinity {self.affinity}{spill}")
        if self.group_queues:
            parts.append("queues " + " ".join(f"{p}→{q}" for p, q in self.group_queues))
        return ", ".join(parts)


def _affinity(setting: str, value: Any) -> str:
    if value not in AFFINITIES:
        raise _fail(setting, value, "one of " + ", ".join(repr(a) for a in AFFINITIES))
    return str(value)


def _spill_seconds(setting: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value < float("inf"):
        raise _fail(setting, value, "None (never: a group waits for its own worker) or "
                                    "a number of seconds, 0 or more, such as 30")
    return float(value)


def _subgroup(setting: str, value: Any) -> str:
    if value not in SUBGROUPS:
        raise _fail(setting, value, "one of " + ", ".join(repr(s) for s in SUBGROUPS) +
                    " ('path': a group \"acme/alice\" is the subgroup 'alice' of 'acme')")
    return str(value)


def _scope(setting: str, value: Any) -> str:
    if value not in SCOPES:
        raise _fail(setting, value, "one of " + ", ".join(repr(s) for s in SCOPES) +
                    " ('app': a group's cap and in-flight count span every fair queue "
                    "whose scope is 'app')")
    return str(value)


def _policy_name(setting: str, value: Any) -> str:
    if value not in POLICIES:
        raise _fail(setting, value, "one of " + ", ".join(repr(p) for p in POLICIES))
    return str(value)


def _charge(setting: str, value: Any) -> str:
    if value not in CHARGES:
        raise _fail(setting, value, "one of " + ", ".join(repr(c) for c in CHARGES))
    return str(value)


def _cap_mode(setting: str, value: Any) -> str:
    if value not in CAP_MODES:
        raise _fail(setting, value, "one of " + ", ".join(repr(m) for m in CAP_MODES))
    return str(value)


def _aging(setting: str, value: Any) -> float:
    try:
        return _aging_in_range(value, setting)
    except InvalidLimit:
        raise _fail(setting, value, "a number of seconds from 0 to 31536000: the wait "
                                    "worth one unit of declared cost under 'smallest' "
                                    "(0: arrival order)") from None


def _interactive_share(setting: str, value: Any) -> float | None:
    try:
        return _share_in_range(value, setting)
    except InvalidLimit:
        raise _fail(setting, value, "None (strict priority) or a number greater than 0 "
                                    "and at most 1, such as 0.8") from None


#: Companion setting -> (PolicyChoice field, validator(setting as written, value)).
COMPANIONS: Mapping[str, tuple[str, Callable[[str, Any], Any]]] = {
    "fair_policy": ("name", _policy_name),
    "fair_charge": ("charge", _charge),
    "fair_cap_mode": ("cap_mode", _cap_mode),
    "fair_interactive_share": ("interactive_share", _interactive_share),
    "fair_aging_seconds": ("aging_seconds", _aging),
    "fair_affinity": ("affinity", _affinity),
    "fair_affinity_spill_seconds": ("spill_seconds", _spill_seconds),
    "fair_group_queues": ("group_queues", group_queues_of),
    "fair_subgroup": ("subgroup", _subgroup),
    "fair_scope": ("scope", _scope),
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
    base = _together("fair_subgroup", PolicyChoice(
        **{field: check(name, get(name)) for name, (field, check) in COMPANIONS.items()}))
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
    return _together(f"{where}['fair_subgroup']", replace(base, **changes))


def _together(setting: str, choice: PolicyChoice) -> PolicyChoice:
    """``choice`` when its companions go together: a subgroup 'path' orders the tasks
    inside a group, as 'smallest' does, so not both; nor with routing (fair_affinity
    'hash', fair_group_queues), whose routed pick does not keep subgroup order yet."""
    try:
        _subgroup_with(choice.name, choice.subgroup, setting)
    except InvalidLimit:
        raise _fail(setting, choice.subgroup, "'none' with fair_policy 'smallest' (both "
                    "order the tasks inside a group): or fair_policy 'wfq' or "
                    "'harmony'") from None
    if choice.subgroup == PATH_SUBGROUP and routes(choice):
        raise _fail(setting, choice.subgroup, "'none' with fair_affinity 'hash' or "
                    "fair_group_queues (the routed pick does not keep subgroup order "
                    "yet): or no routing")
    return choice


def routes(choice: PolicyChoice) -> bool:
    """Whether a queue under ``choice`` routes its picks (store/routing.py): to workers
    (``fair_affinity`` 'hash') or to dedicated real queues (``fair_group_queues``)."""
    return choice.affinity == HASH_AFFINITY or bool(choice.group_queues)


def any_affinity(base: PolicyChoice, per_queue: Mapping[str, PolicyChoice]) -> bool:
    """Whether some fair queue routes groups to workers (``fair_affinity`` 'hash'): then
    the workers consume their own queue (``worker.py``)."""
    return base.affinity == HASH_AFFINITY or any(
        c.affinity == HASH_AFFINITY for c in per_queue.values())
