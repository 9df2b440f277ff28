"""The controls of a fair queue's policy: the settings (``configure``), runtime limits,
pauses, boosts, rate limits and throttles. The operations (``operations.py``) inherit
them; each method has the Lua script of the same name (``store/lua``), as there."""

from __future__ import annotations

from typing import TypeVar

from .. import limits
from ..limits import Rate
from ..store.base import RATE_EARLY_MS, Policy
from ..store.throttling import check_rate_arg
from .common import KEEP, RESET
from .decisions import CLASSES, front_tag, gcra, throttle_due
from .subcaps import SubgroupCaps

N = TypeVar("N", int, float)
V = TypeVar("V")


class QueueControls(SubgroupCaps):
    """A fair queue's settings and the controls laid over them."""

    # -- the policy settings ----------------------------------------------------------

    def configure(self, policy: Policy) -> int:
        """Set the settings, lay the runtime limits over them, re-rank every group and
        unpark what the subgroups' caps now allow; returns how many groups. See
        ``configure.lua``.

        Raises:
            InvalidLimit: a number of ``policy`` out of range (``limits.check_policy``);
                nothing was changed.
        """
        limits.check_policy(policy)
        if (self.policy == limits.SMALLEST and policy.name != limits.SMALLEST) \
                or self.subgroup != policy.subgroup:
            self.keys.clear()  # the lists keep their order (configure.lua)
            self.subtags.clear()
        if policy.name != self.policy:  # the sets' scores change meaning: all re-enter
            self.ready = {klass: {} for klass in CLASSES}
            self.over = {klass: {} for klass in CLASSES}
        self.policy, self.charge = policy.name, policy.charge
        self.cap_mode, self.share = policy.cap_mode, policy.interactive_share
        self.aging, self.subgroup = policy.aging_seconds, policy.subgroup
        self._scope_change(policy.scope)
        if self.cap_mode != limits.SOFT:  # no group stands over its cap
            self.over = {klass: {} for klass in CLASSES}
        before = {g: self.rate_of(g) for g in self.tats}  # rerated below
        self.default_cap = -1 if policy.default_cap is None else policy.default_cap
        self.reserve, self.default_weight = policy.interactive_reserve, policy.default_weight
        self.conf_caps, self.conf_weights = dict(policy.caps), dict(policy.weights)
        self.caps = {**self.conf_caps, **self.limit_caps}
        self.weights = {**self.conf_weights, **self.limit_weights}
        self.default_rate, self.conf_rates = policy.default_rate, dict(policy.rates)
        self.rates = {**self.conf_rates, **self.limit_rates}
        for g, rate in before.items():
            self._rerate(g, rate)
        for g in list(self.groups):
            self._refresh(g)
        self._unpark_all()
        self.woken = True
        return len(self.groups)

    def limit(self, g: str, cap: int | str = KEEP,
              weight: float | str = KEEP) -> tuple[int, float]:
        """Set, keep (:data:`KEEP`) or clear (:data:`RESET`) g's runtime cap (-1: none,
        0: paused) and weight; returns both in force. See ``limit.lua``.

        Raises:
            InvalidLimit: naming the group, when a number is out of range (``limits``);
                nothing was changed.
        """
        if cap not in (KEEP, RESET):
            cap = limits.cap(cap, f"concurrency for group {g!r}", minimum=-1)
        if weight not in (KEEP, RESET):
            weight = limits.weight(weight, f"weight for group {g!r}")
        if cap != KEEP:
            _lay(g, None if cap == RESET else int(cap), self.limit_caps, self.caps,
                 self.conf_caps)
        if weight != KEEP:
            _lay(g, None if weight == RESET else float(weight), self.limit_weights,
                 self.weights, self.conf_weights)
        if self._refresh(g):
            self.woken = True
        if cap != KEEP and "/" in g:  # a subgroup's cap: what it has room for now
            self._unpark_path(g)
        return self.cap_of(g), self.weight_of(g)

    def pause(self, g: str, until_ms: float) -> None:
        """Pause g ('' the whole queue) until ``until_ms`` (inf: until resumed); a pause
        again replaces the last. See ``pause.lua``."""
        self.pauses[g] = until_ms
        if g:
            self._refresh(g)

    def resume(self, g: str) -> bool:
        """Lift g's pause ('' the queue's); True when it was paused. See ``pause.lua``."""
        if self.pauses.pop(g, None) is None:
            return False
        if not g or self._refresh(g):
            self.woken = True
        return True

    def expire_pauses(self, now_ms: int) -> list[str]:
        """Lift the pauses due at ``now_ms``; returns them, by name."""
        due = sorted(g for g, until in self.pauses.items() if until <= now_ms)
        for g in due:
            self.resume(g)
        return due

    def boost(self, g: str, weight: float, until_ms: float) -> None:
        """Pick g with ``weight`` until ``until_ms`` (inf: until unboosted); a boost
        again replaces the last. See ``boost.lua``."""
        self.boosts[g] = (weight, until_ms)
        self._rerank(g)

    def unboost(self, g: str) -> bool:
        """End g's boost; True when it was boosted. See ``boost.lua``."""
        if self.boosts.pop(g, None) is None:
            return False
        self._rerank(g)
        return True

    def _rerank(self, g: str) -> None:
        """g's weight in force changed: under Harmony its rank with it."""
        if self.policy == limits.HARMONY:
            self._refresh(g)

    def boost_task(self, hold_id: str, now_ms: int) -> str | None:
        """Move a held message to the front of its group's list, and the group to the
        front of its class's ready set once; its group, or None when it is not held
        (delayed, dispatched, unknown). See ``boost_task.lua``."""
        held = self.msgs.get(hold_id)
        queue = held and self.lists.get((held.placement.klass, held.placement.group))
        if not held or not queue or hold_id not in queue:
            return None
        klass, g = held.placement.klass, held.placement.group
        ready, group = self.ready[klass], self.groups[g]
        if queue[0] != hold_id:  # a new head
            group.since[klass] = now_ms
        queue.remove(hold_id)
        self._unkey(klass, g, hold_id)
        queue.appendleft(hold_id)
        if self.policy == limits.HARMONY:  # first in the queue, until its next pick
            heads = [s for k in CLASSES for s in self.ready[k].values()]
            group.jump = front_tag(min(heads, default=None), self._rank(g, group))
            self._refresh(g)
            return g
        tag = front_tag(min(ready.values(), default=None), group.tags.get(klass))
        group.tags[klass] = tag
        if tag < (self.vt.get(klass) or 0.0):  # a refresh would take it back to the vt
            self.vt[klass] = tag
        for sets in (ready, self.over[klass]):
            if g in sets:
                sets[g] = tag
        return g

    def expire_boosts(self, now_ms: int) -> list[str]:
        """End the boosts due at ``now_ms``; returns them, by name."""
        due = sorted(g for g, (_, until) in self.boosts.items() if until <= now_ms)
        for g in due:
            self.unboost(g)
        return due

    def set_rate(self, g: str, rate: Rate | str | None) -> Rate | None:
        """Set (a Rate; None: none), keep (:data:`KEEP`) or clear (:data:`RESET`) g's
        runtime rate limit; a change of the rate in force starts its bucket full and
        lifts its old rate's throttle (``_rerate``). Returns the rate in force. See
        ``rate.lua``.

        Raises:
            InvalidLimit: naming the group, when the rate is out of range; nothing was
                changed.
        """
        rate = check_rate_arg(rate, g)
        if rate == KEEP:
            return self.rate_of(g)
        before = self.rate_of(g)
        if not isinstance(rate, str):  # else RESET
            self.limit_rates[g] = self.rates[g] = rate
        else:
            self.limit_rates.pop(g, None)
            self.rates.pop(g, None)
            if g in self.conf_rates:
                self.rates[g] = self.conf_rates[g]
        if self._rerate(g, before) and self._refresh(g):
            self.woken = True
        return self.rate_of(g)

    def _rerate(self, g: str, before: Rate | None) -> bool:
        """g's rate in force was ``before``: when it changed, its bucket starts full and
        the throttle its old rate gave it goes, not a task's (ending later). True when a
        throttle was lifted (the caller refreshes g). See ``common.lua`` ``rerate``."""
        if self.rate_of(g) == before:
            return False
        tat, until = self.tats.pop(g, None), self.throttled.get(g)
        if until is None or tat is None or before is None \
                or until > tat - (before.burst - 1) * before.interval_ms:
            return False  # none, or a task's
        del self.throttled[g]
        return True

    def throttle(self, g: str, until_ms: float) -> float:
        """Pick nothing of g before ``until_ms`` (a later end is kept); returns the end
        in force. See ``rate.lua``."""
        self.throttled[g] = max(self.throttled.get(g, until_ms), until_ms)
        self._refresh(g)
        return self.throttled[g]

    def _meter(self, g: str, now_ms: int) -> None:
        """g was just picked: count it against its rate, and throttle it until its next
        token when its bucket is empty (``pick.lua`` does the same)."""
        rate = self.rate_of(g)
        if rate is None:
            return
        self.tats[g], free_at = gcra(self.tats.get(g), now_ms, rate.interval_ms, rate.burst,
                                     RATE_EARLY_MS)
        if free_at > now_ms:
            self.throttled[g] = free_at
            for klass in CLASSES:
                self.ready[klass].pop(g, None)
                self.over[klass].pop(g, None)

    def _lift_throttles(self, now_ms: int, limit: int) -> int | None:
        """Lift up to ``limit`` throttles ending by ``now_ms`` and forget the arrival
        times more than RATE_EARLY_MS past; returns when the next throttle is to be
        lifted (None: none is left). See ``promote.lua``."""
        order = sorted((until, g.encode(), g) for g, until in self.throttled.items())
        for until, _, g in order[:limit]:
            if until > now_ms:
                break
            del self.throttled[g]
            self._refresh(g)
        self.tats = {g: tat for g, tat in self.tats.items() if tat > now_ms - RATE_EARLY_MS}
        if not self.throttled:
            return None
        return throttle_due(min(self.throttled.values()))


def _lay(g: str, value: N | None, limits: dict[str, N], in_force: dict[str, N],
         settings: dict[str, N]) -> None:
    """Set g's runtime limit to ``value`` (None: clear it, the setting is in force)."""
    if value is not None:
        limits[g] = in_force[g] = value
        return
    limits.pop(g, None)
    in_force.pop(g, None)
    if g in settings:
        in_force[g] = settings[g]
