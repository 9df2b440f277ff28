"""The numbers a user gives celery_fair: caps, weights, costs. One validator per kind.

Every entry point (settings, ``celery fair limit``, :meth:`Store.limit`,
:meth:`Store.configure`, task options) goes through these functions, so a value
accepted in one place is accepted everywhere, and the Lua scripts (``common.lua``
``valid_cap``/``valid_weight``, the same bounds) refuse what slipped past them. A NaN or
an infinity stored once would poison the virtual-time arithmetic of every later pick.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .errors import InvalidCost, InvalidLimit

if TYPE_CHECKING:
    from .store.base import Policy

#: Most tasks one group may have in flight (also the largest interactive reserve).
MAX_CAP = 1_000_000
#: Weights are finite numbers in [MIN_WEIGHT, MAX_WEIGHT]; 1 is the default.
MIN_WEIGHT = 1e-6
MAX_WEIGHT = 1e6
#: Costs are finite numbers in (0, MAX_COST].
MAX_COST = 1e9
#: Most tasks one group may be allowed to hold (fair_group_max_held).
MAX_HELD = 1_000_000_000


def cap(value: Any, what: str, minimum: int = 0) -> int:
    """``value`` as a cap (an integer from ``minimum`` to :data:`MAX_CAP`).

    Parameters:
        value: the number given.
        what: what it is, for the error ("concurrency for group 'acme'").
        minimum: the smallest accepted (0 pauses a group; settings ask for 1).

    Raises:
        InvalidLimit: naming ``what``, the accepted range and ``value``.
    """
    if isinstance(value, bool) or not isinstance(value, int) \
            or not minimum <= value <= MAX_CAP:
        raise InvalidLimit(f"{what} must be an integer from {minimum} to {MAX_CAP:_}, "
                           f"got {value!r}")
    return value


def weight(value: Any, what: str) -> float:
    """``value`` as a weight: a finite number from :data:`MIN_WEIGHT` to :data:`MAX_WEIGHT`.

    Raises:
        InvalidLimit: naming ``what``, the accepted range and ``value``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not MIN_WEIGHT <= value <= MAX_WEIGHT:
        raise InvalidLimit(f"{what} must be a finite number between {MIN_WEIGHT:g} and "
                           f"{MAX_WEIGHT:g}, got {value!r}")
    return float(value)


def cost(value: Any, what: str = "fair cost") -> float:
    """``value`` as a task cost: a finite number in (0, :data:`MAX_COST`].

    Raises:
        InvalidCost: naming ``what``, the accepted range and ``value``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or not 0 < value <= MAX_COST:
        raise InvalidCost(f"{what} must be a finite number in (0, {MAX_COST:g}], "
                          f"got {value!r}")
    return float(value)


def max_held(value: Any, what: str) -> int | None:
    """``value`` as a backpressure limit: None (unlimited) or an integer from 1 to
    :data:`MAX_HELD`.

    Raises:
        InvalidLimit: naming ``what``, the accepted range and ``value``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_HELD:
        raise InvalidLimit(f"{what} must be None (unlimited) or an integer from 1 to "
                           f"{MAX_HELD:_}, got {value!r}")
    return value


def check_policy(policy: Policy) -> Policy:
    """``policy`` when every number in it is in range.

    Raises:
        InvalidLimit: naming the first number out of range.
    """
    if policy.default_cap is not None:
        cap(policy.default_cap, "default concurrency")
    cap(policy.interactive_reserve, "interactive reserve")
    weight(policy.default_weight, "default weight")
    for group, value in policy.caps.items():
        cap(value, f"concurrency for group {group!r}")
    for group, number in policy.weights.items():
        weight(number, f"weight for group {group!r}")
    return policy
