"""The numbers a user gives celery_fair: caps, weights, costs, rates. One validator per
kind.

Every entry point (settings, ``celery fair limit``, :meth:`Store.limit`,
:meth:`Store.configure`, task options) goes through these functions, so a value
accepted in one place is accepted everywhere, and the Lua scripts (``common.lua``
``valid_cap``/``valid_weight``, the same bounds) refuse what slipped past them. A NaN or
an infinity stored once would poison the virtual-time arithmetic of every later pick.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
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
#: Rates: at most MAX_RATE tasks a second, at least one a day; bursts up to MAX_BURST.
MAX_RATE = 1e6
MAX_INTERVAL_MS = 86_400_000.0
MAX_BURST = 1_000_000
_PERIOD_MS = {"s": 1_000.0, "m": 60_000.0, "h": 3_600_000.0, "d": 86_400_000.0}
_RATE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?:/\s*([smhd]))?\s*")


@dataclass(frozen=True)
class Rate:
    """A group's rate limit: one dispatch every ``interval_ms`` on average, and up to
    ``burst`` at once after a quiet spell (GCRA, the token bucket's twin)."""

    interval_ms: float
    burst: int = 1

    @property
    def per_second(self) -> float:
        return 1000.0 / self.interval_ms

    def encode(self) -> str:
        """The stored form, ``<interval ms>:<burst>`` (``common.lua`` ``rate_of``)."""
        return f"{self.interval_ms!r}:{self.burst}"

    def __str__(self) -> str:
        for unit, ms in (("s", 1_000.0), ("m", 60_000.0), ("h", 3_600_000.0)):
            count = ms / self.interval_ms
            if count >= 1 and abs(count - round(count)) < 1e-9:
                text = f"{round(count)}/{unit}"
                break
        else:
            text = f"{self.per_second:.6g}/s"
        return text if self.burst == 1 else f"{text} (burst {self.burst})"


#: The stored form of "no rate limit" (a runtime limit that lifts a default rate).
NO_RATE = "none"


def encode_rate(rate: Rate | None) -> str:
    """A rate's stored form, :data:`NO_RATE` for none."""
    return NO_RATE if rate is None else rate.encode()


def decode_rate(text: str | bytes | None) -> Rate | None:
    """A stored rate (:meth:`Rate.encode`); None for :data:`NO_RATE`, nothing or damage."""
    if isinstance(text, bytes):
        text = text.decode()
    if not text or text == NO_RATE or ":" not in text:
        return None
    interval, _, burst = text.partition(":")
    try:
        found = Rate(float(interval), int(burst))
    except ValueError:
        return None
    return found if _rate_in_range(found) else None


def _rate_in_range(r: Rate) -> bool:
    return (math.isfinite(r.interval_ms) and 1000.0 / MAX_RATE <= r.interval_ms
            <= MAX_INTERVAL_MS and 1 <= r.burst <= MAX_BURST)


def rate(value: Any, what: str, burst: Any = 1) -> Rate:
    """``value`` as a rate limit: Celery's notation (``"10/s"``, ``"100/m"``, ``"5/h"``,
    also ``"/d"``; a bare number is per second) or a :class:`Rate`, with ``burst`` (an
    integer from 1 to :data:`MAX_BURST`).

    Raises:
        InvalidLimit: naming ``what``, what is accepted and ``value``.
    """
    if isinstance(value, Rate):  # its own burst, unless another is given
        burst = value.burst if burst == 1 else burst
        interval = value.interval_ms  # a Rate built by hand: '100' fails here, named
        found = (Rate(interval, burst) if isinstance(burst, int)
                 and isinstance(interval, (int, float)) and not isinstance(interval, bool)
                 else None)
    else:
        found = _parse_rate(value, burst)
    if found is None or isinstance(burst, bool) or not _rate_in_range(found):
        raise InvalidLimit(
            f"{what} must be a rate such as '10/s', '100/m' or '5/h' (at most "
            f"{MAX_RATE:g}/s, at least 1/d) with a burst from 1 to {MAX_BURST:_}, got "
            f"{value!r}" + ("" if burst == 1 else f" with burst {burst!r}"))
    return found


def _parse_rate(value: Any, burst: Any) -> Rate | None:
    if isinstance(value, bool) or not isinstance(burst, int):
        return None
    if isinstance(value, (int, float)):
        count, period = float(value), 1_000.0
    elif isinstance(value, str) and (m := _RATE.fullmatch(value)):
        count, period = float(m.group(1)), _PERIOD_MS[m.group(2) or "s"]
    else:
        return None
    if not math.isfinite(count) or count <= 0:
        return None
    return Rate(period / count, burst)


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


#: The scheduling policies (``fair_policy``): weighted start-time fair queueing,
#: Harmony's fewest tasks in flight first, and wfq's group order with the smallest
#: declared cost first inside a group, aged (DESIGN.md, "Scheduling"); common.lua has them.
WFQ, HARMONY, SMALLEST = "wfq", "harmony", "smallest"
POLICIES = (WFQ, HARMONY, SMALLEST)
#: ``fair_aging_seconds`` under 'smallest': a held task of cost c ranks as if it had
#: become dispatchable c times this many seconds later (0: arrival order); common.lua has
#: the default and the bound (a year, as MAX_RUNTIME).
DEFAULT_AGING = 1.0
MAX_AGING = 31_536_000.0
#: How a group's cap binds (``fair_cap_mode``): always ('hard'), or only while no other
#: group has work waiting ('soft': an over-cap group is picked only as a fallback).
HARD, SOFT = "hard", "soft"
CAP_MODES = (HARD, SOFT)
#: Two-level fairness (``fair_subgroup``): none, or a group named "<group>/<subgroup>"
#: (split at its first "/") is held in <group>, and inside a group the subgroups take
#: turns by self-clocked fair queueing (common.lua ``subgroup_key``).
NO_SUBGROUP, PATH_SUBGROUP = "none", "path"
SUBGROUPS = (NO_SUBGROUP, PATH_SUBGROUP)
#: Where a group's in-flight count is counted against its cap (``fair_scope``): in each
#: fair queue apart ('queue'), or once over every fair queue of the app whose scope is
#: 'app' (DESIGN.md "Tenant scope"; common.lua ``scope_app``).
QUEUE_SCOPE, APP_SCOPE = "queue", "app"
SCOPES = (QUEUE_SCOPE, APP_SCOPE)


def aging(value: Any, what: str) -> float:
    """``fair_aging_seconds``: a number of seconds from 0 to ``MAX_AGING``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 <= value <= MAX_AGING:
        raise InvalidLimit(f"{what} must be a number of seconds from 0 to {MAX_AGING:g} "
                           f"(seconds of waiting worth one unit of cost), got {value!r}")
    return float(value)


def subgroup(policy: str, value: Any, what: str) -> str:
    """``fair_subgroup``: 'none' or 'path', and not 'path' with the policy 'smallest'
    (both order the tasks inside a group)."""
    if value not in SUBGROUPS:
        raise InvalidLimit(f"{what} must be one of {', '.join(map(repr, SUBGROUPS))}, "
                           f"got {value!r}")
    if value == PATH_SUBGROUP and policy == SMALLEST:
        raise InvalidLimit(f"{what} 'path' does not go with the policy 'smallest' (both "
                           "order the tasks inside a group): use 'wfq' or 'harmony'")
    return str(value)


def scope_unsupported(policy: Policy, store: str, why: str) -> None:
    """Refuse ``fair_scope`` 'app' on a store that does not count across queues
    (``store``, ``why``), before anything is written."""
    if policy.scope == APP_SCOPE:
        raise InvalidLimit(f"scope 'app' (fair_scope) is not supported on {store} "
                           f"({why}): use fair_scope 'queue' there")


def interactive_share(value: Any, what: str) -> float | None:
    """``fair_interactive_share``: None (strict priority) or a number in (0, 1]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value <= 1:
        raise InvalidLimit(f"{what} must be None (strict priority) or a number greater "
                           f"than 0 and at most 1, got {value!r}")
    return float(value)


#: What a dispatch charges a group's share under ``wfq`` (``fair_charge``): its declared
#: cost (the default, as before the setting), 1 per task, or the wall time it ran (the
#: declared cost, in seconds, charged at dispatch as the estimate and corrected at
#: release by the time the worker measured); common.lua has them.
COST, COUNT, RUNTIME = "cost", "count", "runtime"
CHARGES = (COST, COUNT, RUNTIME)
#: The longest runtime a release may report (seconds, a year); common.lua has the same.
MAX_RUNTIME = 31_536_000.0


def runtime_of(value: object) -> float | None:
    """A runtime a release reports, in seconds: None (none reported: an older worker, a
    release kept for retry, a lost run) for anything but a finite number from 0 to
    ``MAX_RUNTIME``. ``release.lua`` reads its argument the same way."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not 0 <= value <= MAX_RUNTIME:  # NaN fails both
        return None
    return float(value)


def check_policy(policy: Policy) -> Policy:
    """``policy`` when every number in it is in range.

    Raises:
        InvalidLimit: naming the first number out of range.
    """
    if policy.name not in POLICIES:
        raise InvalidLimit(f"policy must be one of {', '.join(map(repr, POLICIES))}, "
                           f"got {policy.name!r}")
    if policy.cap_mode not in CAP_MODES:
        raise InvalidLimit(f"cap mode must be one of {', '.join(map(repr, CAP_MODES))}, "
                           f"got {policy.cap_mode!r}")
    interactive_share(policy.interactive_share, "interactive share")
    aging(policy.aging_seconds, "aging")
    subgroup(policy.name, policy.subgroup, "subgroup")
    if policy.scope not in SCOPES:
        raise InvalidLimit(f"scope must be one of {', '.join(map(repr, SCOPES))}, "
                           f"got {policy.scope!r}")
    if policy.charge not in CHARGES:
        raise InvalidLimit(f"charge must be one of {', '.join(map(repr, CHARGES))}, "
                           f"got {policy.charge!r}")
    if policy.default_cap is not None:
        cap(policy.default_cap, "default concurrency")
    cap(policy.interactive_reserve, "interactive reserve")
    weight(policy.default_weight, "default weight")
    for group, value in policy.caps.items():
        cap(value, f"concurrency for group {group!r}")
    for group, number in policy.weights.items():
        weight(number, f"weight for group {group!r}")
    if policy.default_rate is not None:
        rate(policy.default_rate, "default rate limit")
    for group, limit in policy.rates.items():
        if limit is not None:
            rate(limit, f"rate limit for group {group!r}")
    return policy
