"""The policy settings on Redis: ``configure`` (the settings, at a dispatcher's start) and
the runtime caps and weights (``limit``), ``configure.lua`` and ``limit.lua``."""

from __future__ import annotations

import json
from typing import Any

from .. import limits
from ..names import validate_group
from .base import CHECK_BATCH
from .connection import _text
from .models import KEEP, RESET, Policy
from .scope_check import CHARGE, Finding, charge_finding, count_finding


class RedisPolicy:
    """A mixin of :class:`~celery_fair.store.redis.RedisStore` (it gives ``_run``)."""

    _run: Any
    client: Any
    keys: Any
    #: fair_scope 'app' counts across queues (common.lua SC): not on Redis Cluster
    supports_app_scope = True

    def configure(self, queue: str, policy: Policy) -> None:
        """Raises :class:`~celery_fair.errors.InvalidLimit` (nothing written) when a
        number of ``policy`` is out of range (:mod:`celery_fair.limits`)."""
        limits.check_policy(policy)
        if not self.supports_app_scope:
            limits.scope_unsupported(policy, "Redis Cluster",
                                     "a script reaches one slot: route a group to one queue")
        self._run("configure", queue,
                  -1 if policy.default_cap is None else policy.default_cap,
                  policy.interactive_reserve, policy.default_weight,
                  json.dumps(dict(policy.caps)), json.dumps(dict(policy.weights)),
                  json.dumps({g: limits.encode_rate(r) for g, r in policy.rates.items()}),
                  "" if policy.default_rate is None else policy.default_rate.encode(),
                  policy.name, policy.charge, policy.cap_mode,
                  "" if policy.interactive_share is None else repr(policy.interactive_share),
                  repr(float(policy.aging_seconds)), policy.subgroup, policy.scope)

    def limit(self, queue: str, group: str, cap: int | str = KEEP,
              weight: float | str = KEEP) -> tuple[int | None, float]:
        """Set (or with :data:`RESET` clear) ``group``'s runtime cap and weight in
        ``queue``; they take precedence over the settings and survive restarts.
        ``cap`` -1 means no cap, 0 pauses the group. Returns the cap and weight now in
        force (cap None: none).

        Raises:
            InvalidGroup: ``group`` is not a group name.
            InvalidLimit: ``cap`` or ``weight`` is out of range (:mod:`celery_fair.limits`);
                nothing was written.
        """
        group = validate_group(group)
        cap_now, weight_now = self._run("limit", queue, group, _cap_arg(group, cap),
                                        _weight_arg(group, weight))
        value = int(_text(cap_now))
        return (None if value < 0 else value), float(_text(weight_now))


    def check_scope(self, repair: bool, *, batch: int = CHECK_BATCH) -> list[Finding]:
        """``fair check`` of fair_scope 'app' (``check_scope.lua``, ``scope_check.py``),
        ``batch`` groups a script call (each group atomically)."""
        if not self.supports_app_scope:
            return []
        k = self.keys("")
        client = self.client
        names = {_text(g) for g in client.hkeys(k.scope("n"))}
        names |= {_text(f).partition(":")[2] for f in client.hkeys(k.scope("charge"))}
        for queue in sorted(_text(q) for q in client.smembers(k.scope("queues"))):
            names |= {_text(g) for g in client.sscan_iter(self.keys(queue).groups, count=500)}
        out: list[Finding] = []
        ordered = sorted(names)
        for start in range(0, len(ordered), max(batch, 1)):
            flat = self._run("check_scope", "", "1" if repair else "0",
                             *ordered[start:start + max(batch, 1)])
            for i in range(0, len(flat), 4):
                g, kind, counted, parts = (_text(x) for x in flat[i:i + 4])
                if kind == CHARGE:
                    out.append(charge_finding(g, repair))
                    continue
                split = parts.split("\n") if parts else []
                flights = {q: int(n) for q, n in zip(split[::2], split[1::2])}
                out.append(count_finding(g, int(counted), flights, repair))
        return out


def _cap_arg(group: str, cap: int | str) -> str:
    """limit.lua's ARGV for ``cap``: KEEP, RESET, -1 (no cap) or a checked cap."""
    if cap in (KEEP, RESET) or (cap == -1 and not isinstance(cap, bool)):
        return str(cap)
    return str(limits.cap(cap, f"concurrency for group {group!r}"))


def _weight_arg(group: str, weight: float | str) -> str:
    if weight in (KEEP, RESET):
        return str(weight)
    return repr(limits.weight(weight, f"weight for group {group!r}"))
