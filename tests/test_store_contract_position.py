"""Positions and tip-of-queue waits through the store contract, on every backend
(``any_store``): ``locate`` finds a copy held under a suffixed id, ``position_of`` turns
what it found into a :class:`~celery_fair.position.Position` (its wait estimate from the
summary's release rate), and ``longest_heads`` ranks groups by how long their head has
waited, not by how much they hold."""

from __future__ import annotations

import json

import pytest

from celery_fair.config import SETTINGS
from celery_fair.envelope import Envelope
from celery_fair.position import Position, position_of
from celery_fair.store.base import Placement, Policy, Store

Q = "q"
NOW = 1_700_000_000_000
DEFAULTS = {s.name: s.default for s in SETTINGS}


def hold(store: Store, task_id: str, group: str, due_at: float | None = None,
         body: bytes = b"{}", now_ms: int = NOW) -> str:
    envelope = Envelope(body=body, content_type="application/json",
                        content_encoding="utf-8", headers={"id": task_id, "task": "t"},
                        exchange="", routing_key=Q, queue=Q, due_at=due_at)
    return store.hold(Q, task_id, envelope.encode(group, "b", 1.0, False),
                      Placement(group, "b", 1.0, False), 0, now_ms)


@pytest.fixture
def store(any_store: Store) -> Store:
    any_store.configure(Q, Policy(None, DEFAULTS["fair_interactive_reserve"], 1.0, {}, {}))
    return any_store


def test_a_copy_held_under_a_suffixed_id_is_found_by_its_task_id(store: Store) -> None:
    hold(store, "t1", "acme")
    copy = hold(store, "t1", "acme", body=b"[]")  # the same id again (not a resend)
    assert copy.startswith("t1~")
    assert [p.hold_id for p in store.pick(Q, 1, None, NOW, 60_000)] == ["t1"]
    where = store.locate("t1")  # t1 itself is dispatched; its copy is held
    assert where is not None and (where.task_id, where.state) == ("t1", "held")
    assert position_of(store, where) == Position(1, 0, 0, None, "held", Q, "acme")


def test_a_position_tells_each_state_and_estimates_from_the_release_rate(
        store: Store) -> None:
    for i in range(3):
        hold(store, f"a{i}", "acme")
    assert position_of(store, store.locate("nobody")) == \
        Position(None, None, None, None, "not held")
    assert position_of(store, store.locate("a2")).eta_seconds is None  # no summary yet
    store.put_summary(Q, json.dumps({"release_rate": 2.0}), ttl_seconds=60)
    assert position_of(store, store.locate("a2")) == \
        Position(3, 0, 2, 1.5, "held", Q, "acme")  # 3 dispatches at 2 a second
    store.pick(Q, 1, None, NOW, 60_000)
    assert position_of(store, store.locate("a0")) == \
        Position(0, None, 0, 0.0, "dispatched", Q, "acme")
    assert position_of(store, store.locate("a2")).in_group == 2


def test_longest_heads_rank_groups_by_head_wait_not_by_backlog(store: Store) -> None:
    now = NOW / 1000
    for i in range(5):
        hold(store, f"big{i}", "big", due_at=now - 10, now_ms=NOW - 10_000)
    # one task, waiting longest
    hold(store, "s0", "small", due_at=now - 60, now_ms=NOW - 60_000)
    hold(store, "n0", "new", due_at=now - 1, now_ms=NOW - 1000)
    hold(store, "old0", "undated")  # no due time: its wait counts from its head time
    assert [h.group for h in store.longest_heads(Q, 10)] == ["small", "big", "new",
                                                              "undated"]
    [small] = store.longest_heads(Q, 1)
    assert (small.group, small.due_background) == ("small", now - 60)
    assert store.longest_heads(Q, 0) == []
    assert [h.group for h in store.longest_heads(Q, 10, scan=1)] == ["big"]  # the bound
