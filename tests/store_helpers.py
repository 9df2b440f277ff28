"""What the store tests share: stored values, holds and picks on the fair queue ``Q``,
on the caller's clock (``NOW``), through the public contract only (any backend).

The contract suite (tests/test_store_contract_*.py) runs unchanged against every backend
(the ``any_store`` fixture, which ``store`` names as its tests call it: memory,
Redis, SQLite, PostgreSQL, MariaDB). Times are passed in explicitly (milliseconds), so
every test is deterministic: nothing depends on the wall clock or on scheduling.
Redis-only behaviour (wake lists, scripts, TTLs, key layout) is tests/test_store_redis.py's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

import pytest

from celery_fair.config import SETTINGS
from celery_fair.envelope import BACKGROUND, Envelope
from celery_fair.store.base import BeginResult, Picked, Placement, Policy, Store
from celery_fair.store.memory import MemoryStore
from celery_fair.store.models import HARMONY, WFQ

from .backends import BACKENDS

Q = "fairq"

#: Every backend under each policy, as pairs of the ``any_store`` parameter and the policy.
each_policy = pytest.mark.parametrize(
    "any_store, policy", [(b, p) for p in (WFQ, HARMONY) for b in BACKENDS],
    indirect=["any_store"])


@pytest.fixture(name="store")
def store_fixture(any_store: Store) -> Store:
    """The backend under test (``any_store``), under the name the store tests use."""
    return any_store


def flushed(store: Store) -> Iterator[Store]:
    """``store`` for one test (an ``any_store`` fixture's body), flushed and closed after."""
    try:
        yield store
    finally:
        store.flush()
        store.close()

NOW = 1_700_000_000_000
LEASE = 10_000  # picked lease (ms)


def value(group: str, klass: str = BACKGROUND, cost: float = 1, front: bool = False,
          body: bytes = b"[[], {}, {}]", task_id: str = "t") -> bytes:
    envelope = Envelope(body=body, content_type="application/json", content_encoding="utf-8",
                        headers={"id": task_id, "task": "proj.work"}, exchange="",
                        routing_key=Q, queue=Q)
    return envelope.encode(group, klass, cost, front)


_counter = iter(range(10**9))


def hold(store: Store, group: str, klass: str = BACKGROUND, cost: float = 1,
         front: bool = False, hold_id: str | None = None, due: int = 0, now: int = NOW,
         body: bytes | None = None) -> str:
    hid = hold_id or f"{group}-{next(_counter)}"
    data = value(group, klass, cost, front, body=body if body is not None else hid.encode())
    return store.hold(Q, hid, data, Placement(group, klass, cost, front), due, now)


def group_of(item: Picked) -> str:
    return Envelope.decode(item.value)[0]


def klass_of(item: Picked) -> str:
    return Envelope.decode(item.value)[1]


def pick(store: Store, limit: int = 1, capacity: int | None = None, now: int = NOW,
         lease: int = LEASE) -> list[Picked]:
    return store.pick(Q, limit, capacity, now, lease)


def pick_groups(store: Store, total: int, batch: int = 1, **kw) -> list[str]:
    order: list[str] = []
    while len(order) < total:
        got = pick(store, min(batch, total - len(order)), **kw)
        assert got, f"pick returned nothing after {len(order)} of {total}"
        order.extend(group_of(p) for p in got)
    return order


def assert_round_robin(order: Iterable[str], groups: Iterable[str]) -> None:
    """No group ever gets two ahead of another, at any point of the order."""
    counts = Counter({g: 0 for g in groups})
    for i, g in enumerate(order):
        counts[g] += 1
        spread = max(counts.values()) - min(counts.values())
        assert spread <= 1, f"after {i + 1} picks the counts are {dict(counts)}"


def snapshot_groups(store: Store) -> dict[str, dict]:
    return {row["group"]: row for row in store.snapshot(Q)["groups"]}


#: The production default of fair_interactive_reserve: tests configure what runs.
RESERVE = next(s.default for s in SETTINGS if s.name == "fair_interactive_reserve")


def configure(store: Store, cap: int | None = None, reserve: int = RESERVE,
              weight: float = 1.0, caps: dict | None = None,
              weights: dict | None = None) -> None:
    store.configure(Q, Policy(cap, reserve, weight, caps or {}, weights or {}))


def _running(store: Store, acks_late: bool, run: str = "first") -> Picked:
    hold(store, "a", hold_id="x", body=b"payload")
    [p] = pick(store, 1)
    assert store.confirm(Q, [p.dispatch_id], NOW + 1_000) == []
    assert store.begin(Q, p.dispatch_id, NOW + 30_000, now_ms=NOW, run=run,
                       acks_late=acks_late) is BeginResult.RUN
    return p


def _held_truth(store: Store) -> tuple[dict[str, int], int, int]:
    """What is held, counted from each group's figures (its lists' lengths), not from the
    totals and the ranking the store keeps besides."""
    per_group, by_class = {}, {"i": 0, "b": 0}
    for g, row in snapshot_groups(store).items():
        by_class = {"i": by_class["i"] + row["held_interactive"],
                    "b": by_class["b"] + row["held_background"]}
        if row["held_interactive"] + row["held_background"]:
            per_group[g] = row["held_interactive"] + row["held_background"]
    return per_group, by_class["i"], by_class["b"]


def _assert_counters_exact(store: Store) -> None:
    per_group, held_i, held_b = _held_truth(store)
    figures = store.queue_figures(Q)
    assert (figures.held_interactive, figures.held_background) == (held_i, held_b)
    assert dict(store.top_groups(Q, 1000)) == per_group


class NoRouting(MemoryStore):
    """A backend of the contract without affinity routing (every store of celery-fair
    has it): what ``refuse_affinity`` and ``refuse_group_queues`` are for."""

    supports_affinity = False
