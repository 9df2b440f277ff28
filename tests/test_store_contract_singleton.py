"""The store contract for singleton keys (``Placement.singleton``, issue 14 item 4): at
most one message of a key is out of its waiting list (listed in its group, or in
flight); the others wait in order without blocking their group; the key passes on at
release, at a reclaim that loses the slot, and when its listed owner is cancelled; a
reclaim held again keeps the key; a delayed one takes its turn when due; ``drop``
refuses a hold whose key has one waiting. Every backend keeps them (the SQL stores since
revision 0014, ``store/sql/singletons.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_fair.check import check
from celery_fair.envelope import BACKGROUND, INTERACTIVE
from celery_fair.errors import InvalidOption, SingletonDropped
from celery_fair.store.base import Placement, Store
from celery_fair.store.bulk import Hold

from .backends import SQL_BACKENDS
from .store_helpers import (
    LEASE,
    NOW,
    Q,
    configure,
    pick,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
    value,
)


def hold(store: Store, hold_id: str, key: str | None, group: str = "a", drop: bool = False,
         klass: str = BACKGROUND, front: bool = False, due: int = 0, now: int = NOW) -> str:
    data = value(group, klass, 1, front, body=hold_id.encode(), task_id=hold_id)
    return store.hold(Q, hold_id, data, Placement(group, klass, 1, front, None, key, drop),
                      due, now)


def ids(store: Store, n: int = 10, now: int = NOW) -> list[str]:
    return [p.hold_id for p in pick(store, n, now=now)]


def dids(store: Store, n: int = 10, now: int = NOW) -> dict[str, str]:
    return {p.hold_id: p.dispatch_id for p in pick(store, n, now=now)}


def test_one_per_key_in_flight_the_rest_in_order_and_the_group_not_blocked(
        store: Store) -> None:
    configure(store)
    for hid, key in (("k1", "x"), ("k2", "x"), ("free", None), ("k3", "x"), ("y1", "y")):
        hold(store, hid, key)
    first = dids(store)
    assert set(first) == {"k1", "free", "y1"}  # k2, k3 wait for x; nothing else does
    assert ids(store) == []
    assert store.release(Q, first["k1"])
    second = dids(store)
    assert list(second) == ["k2"]  # the next of x, in order
    assert store.release(Q, first["y1"]) and ids(store) == []
    assert store.release(Q, second["k2"])
    assert ids(store) == ["k3"]


def test_a_waiter_enters_at_the_head_of_its_class(store: Store) -> None:
    configure(store)
    hold(store, "k1", "x")
    hold(store, "k2", "x")
    running = dids(store, 1)
    for n in range(3):
        hold(store, f"plain{n}", None)
    store.release(Q, running["k1"])
    assert ids(store, 1) == ["k2"]  # it waited its turn already: ahead of later holds


def test_a_key_spans_groups_and_classes(store: Store) -> None:
    configure(store)
    hold(store, "a1", "x", group="a", klass=INTERACTIVE)
    hold(store, "b1", "x", group="b")
    running = dids(store)
    assert list(running) == ["a1"]
    store.release(Q, running["a1"])
    assert ids(store) == ["b1"]


def test_drop_refuses_only_while_the_key_has_one_waiting(store: Store) -> None:
    configure(store)
    hold(store, "r1", "x", drop=True)  # listed, waiting: the next one is dropped
    with pytest.raises(SingletonDropped) as dropped:
        hold(store, "r2", "x", drop=True)
    assert dropped.value.task_id == "r2" and dropped.value.key == "x"
    running = dids(store)
    hold(store, "r3", "x", drop=True)  # r1 runs, none waits: held, waiting
    with pytest.raises(SingletonDropped):
        hold(store, "r4", "x", drop=True)
    hold(store, "w1", "x")  # 'wait' is never dropped
    store.release(Q, running["r1"])
    assert ids(store) == ["r3"]
    held = {m.hold_id for m in store.held_messages(Q, "a", 100)}
    assert "r2" not in held and "r4" not in held


def test_a_reclaim_that_holds_again_keeps_the_key(store: Store) -> None:
    configure(store)
    hold(store, "k1", "x")
    hold(store, "k2", "x")
    assert ids(store) == ["k1"]  # picked, never confirmed: its lease runs out
    assert store.reclaim(Q, NOW + LEASE + 1, 100) == (1, 0)
    later = NOW + LEASE + 2
    assert ids(store, now=later) == ["k1"]  # again, before k2
    assert ids(store, now=later) == []


def test_a_lost_dispatch_frees_the_key(store: Store) -> None:
    configure(store)
    hold(store, "k1", "x")
    hold(store, "k2", "x")
    [picked] = pick(store, 1)
    store.begin(Q, picked.dispatch_id, NOW + 1_000, now_ms=NOW, run="r",
                acks_late=False)  # running without its bytes: lost at reclaim
    assert store.reclaim(Q, NOW + 2_000, 100) == (0, 1)
    assert ids(store, now=NOW + 2_001) == ["k2"]


def test_a_waiter_entering_at_a_lost_dispatch_keeps_its_groups_tag(store: Store) -> None:
    """The key passes on before the lost dispatch's slot is freed: its group is not idle
    (its own work waited for the key), so it is not forgotten and keeps the tag its pick
    charged; it does not re-enter at the virtual time, ahead of a group served less."""
    configure(store)
    data = value("a", BACKGROUND, 2, False, body=b"k1", task_id="k1")
    store.hold(Q, "k1", data, Placement("a", BACKGROUND, 2, False, None, "x"), 0, NOW)
    hold(store, "k2", "x")
    hold(store, "b1", None, group="b")
    hold(store, "b2", None, group="b")
    first = dids(store, 2)  # a at tag 0 (then 2), b at tag 0 (then 1)
    assert set(first) == {"k1", "b1"}
    store.begin(Q, first["k1"], NOW + 1_000, now_ms=NOW, run="r",
                acks_late=False)  # running without its bytes: lost at reclaim
    assert store.reclaim(Q, NOW + 2_000, 100) == (0, 1)
    assert ids(store, 1, now=NOW + 2_001) == ["b2"]  # b's tag 1 before a's 2
    assert ids(store, 1, now=NOW + 2_001) == ["k2"]


def test_a_delayed_one_that_waits_at_promote_leaves_no_empty_group(store: Store) -> None:
    """Waiting for its key, a message is in no group: the group it left at promote,
    with nothing else, is forgotten then (not left behind until something else of it
    happens), and comes back when the waiter enters."""
    configure(store)
    hold(store, "k1", "x", group="a")
    hold(store, "d1", "x", group="b", due=NOW + 1_000)
    running = dids(store)
    assert store.promote(Q, NOW + 1_000, 100)[0] == 1
    assert store.queue_figures(Q).group_count == 1  # a (in flight); b has nothing
    assert store.release(Q, running["k1"])
    assert store.queue_figures(Q).group_count == 1  # b, its waiter entered
    assert ids(store, now=NOW + 1_001) == ["d1"]


def test_a_waiter_entering_at_its_owners_cancel_keeps_its_groups_tag(store: Store) -> None:
    """Cancel of a listed owner: the key's next waiter enters before the owner leaves,
    so a group whose own waiter takes over is not forgotten in between; it keeps the
    tag its picks charged instead of re-entering at the virtual time."""
    configure(store)
    data = value("a", BACKGROUND, 3, False, body=b"p1", task_id="p1")
    store.hold(Q, "p1", data, Placement("a", BACKGROUND, 3, False), 0, NOW)
    hold(store, "k1", "x")
    hold(store, "k2", "x")
    running = dids(store, 1)  # a: tag 0, then 3
    assert list(running) == ["p1"] and store.release(Q, running["p1"])
    hold(store, "b1", None, group="b")  # b enters at the virtual time, 0
    hold(store, "b2", None, group="b")
    assert [task_id for task_id, _ in store.cancel(Q, ["k1"], token="t", now_ms=NOW)] \
        == ["k1"]
    assert ids(store, 3) == ["b1", "b2", "k2"]  # b's tags 0, 1 before a's 3


def test_cancel_of_the_owner_or_of_a_waiter(store: Store) -> None:
    configure(store)
    for hid in ("k1", "k2", "k3"):
        hold(store, hid, "x")
    assert [h for h, _ in store.cancel(Q, ["k2"], now_ms=NOW)] == ["k2"]  # a waiter
    assert [h for h, _ in store.cancel(Q, ["k1"], now_ms=NOW)] == ["k1"]  # the owner
    assert ids(store) == ["k3"]
    assert store.cancel(Q, ["k3"], now_ms=NOW) == []  # in flight: not touched


def test_a_delayed_one_takes_its_turn_when_due(store: Store) -> None:
    configure(store)
    hold(store, "late", "x", due=NOW + 1_000)
    hold(store, "now", "x")
    running = dids(store)
    assert list(running) == ["now"]
    store.promote(Q, NOW + 1_000, 100)
    assert ids(store, now=NOW + 1_000) == []  # due, but x is in flight
    store.release(Q, running["now"])
    assert ids(store, now=NOW + 1_001) == ["late"]


def test_bulk_holds_wait_alike_and_refuse_drop(store: Store) -> None:
    configure(store)
    holds = [Hold(h, value("a", body=h.encode(), task_id=h),
                  Placement("a", BACKGROUND, 1.0, False, None, "x"), 0) for h in ("b1", "b2")]
    store.hold_many(Q, holds, NOW)
    running = dids(store)
    assert list(running) == ["b1"]
    drop = Hold("b3", value("a", body=b"b3", task_id="b3"),
                Placement("a", BACKGROUND, 1.0, False, None, "x", True), 0)
    with pytest.raises(InvalidOption, match="drop"):
        store.hold_many(Q, [drop], NOW)
    store.release(Q, running["b1"])
    assert ids(store) == ["b2"]


@pytest.mark.parametrize("any_store", ["redis", *SQL_BACKENDS], indirect=True)
def test_the_checker_finds_no_orphan_in_a_waiting_list(store: Store) -> None:
    configure(store)
    hold(store, "k1", "x")
    hold(store, "k2", "x")
    report = check(store, repair=True)
    assert report.ok, report.findings  # not an orphan, not counted as held or delayed
    assert ids(store) == ["k1"]  # k2 still waits: the repair pushed nothing


@pytest.mark.parametrize("any_store", ["redis"], indirect=True)
def test_the_checker_passes_on_a_key_whose_owner_is_gone(store: Store) -> None:
    """Damage (a partial flush, a failover losing writes) leaves a key owned by a message
    that is neither held nor in flight: its waiters would wait for ever. `fair check`
    reports it and the repair passes the key on."""
    configure(store)
    hold(store, "k1", "x")
    hold(store, "k2", "x")
    client: Any = store.client  # type: ignore[attr-defined]
    keys: Any = store.keys(Q)  # type: ignore[attr-defined]
    client.hdel(keys.msg, "k1")  # the owner's message lost
    client.lrem(keys.held(BACKGROUND, "a"), 1, "k1")
    report = check(store, repair=True)
    assert [f.subject for f in report.findings if f.kind == "singleton_owner"] == ["x"]
    assert ids(store) == ["k2"]
    assert not [f for f in check(store).findings if f.kind == "singleton_owner"]


@pytest.mark.parametrize("any_store", SQL_BACKENDS, indirect=True)
def test_the_sql_checker_passes_on_a_key_whose_owner_is_gone(store: Store) -> None:
    """The same damage on a SQL store: the owner's row deleted behind the store's back."""
    configure(store)
    hold(store, "k1", "x")
    hold(store, "k2", "x")
    sql: Any = store
    m = sql.t.messages
    with sql.engine.begin() as conn:
        conn.execute(m.delete().where(m.c.ns == sql.namespace, m.c.hold_id == "k1"))
    report = check(store, repair=True)
    assert [f.subject for f in report.findings if f.kind == "singleton_owner"] == ["x"]
    assert ids(store) == ["k2"]
    assert check(store).ok


# -- a key's scope is the app: every fair queue of the namespace ---------------------------
# (not on Redis Cluster, where it is the queue: test_cluster.py leaves out APP_SCOPE)

Q2 = "fairq2"
APP_SCOPE = ("test_a_key_spans_queues_and_passes_on_at_the_other_queues_promote",
             "test_cancel_of_a_waiter_or_a_handed_owner_in_another_queue",
             "test_a_lost_dispatch_passes_its_key_to_another_queue",
             "test_a_requeued_dispatch_keeps_its_key_across_queues",
             "test_drop_refuses_while_the_key_waits_in_another_queue",
             "test_a_delayed_one_waits_for_its_key_in_another_queue_when_due")


def hold2(store: Store, hold_id: str, key: str | None, drop: bool = False,
          due: int = 0) -> str:
    data = value("a", BACKGROUND, 1, False, body=hold_id.encode(), task_id=hold_id)
    return store.hold(Q2, hold_id, data, Placement("a", BACKGROUND, 1, False, None, key, drop),
                      due, NOW)


def ids2(store: Store, now: int = NOW) -> list[str]:
    return [p.hold_id for p in store.pick(Q2, 10, None, now, LEASE)]


def test_a_key_spans_queues_and_passes_on_at_the_other_queues_promote(
        store: Store) -> None:
    configure(store)
    hold(store, "k1", "x")
    running = dids(store)
    hold2(store, "k2", "x")  # x in flight in Q: k2 waits in Q2
    hold2(store, "free", None)
    assert ids2(store) == ["free"]
    store.promote(Q2, NOW, 100)
    assert ids2(store) == []
    store.wait([Q2], 0)  # what the holds woke
    assert store.release(Q, running["k1"])
    assert store.wait([Q2], 0) == {Q2}  # the release wakes Q2's dispatchers
    assert ids2(store, NOW + 1) == []  # handed to Q2: listed at its promote
    report = check(store)  # a handed waiter is neither an orphan nor a lost owner
    assert report.ok, report.findings
    store.promote(Q2, NOW + 1, 100)
    assert ids2(store, NOW + 1) == ["k2"]
    hold(store, "k3", "x")  # x in flight in Q2 now
    assert ids(store) == []
    assert check(store).ok


def test_cancel_of_a_waiter_or_a_handed_owner_in_another_queue(store: Store) -> None:
    configure(store)
    hold(store, "k1", "x")
    running = dids(store)
    hold2(store, "c1", "x")
    hold2(store, "c2", "x")
    hold(store, "k3", "x")
    assert [h for h, _ in store.cancel(Q2, ["c1"], now_ms=NOW)] == ["c1"]  # a waiter
    assert store.release(Q, running["k1"])  # x is handed to c2, in Q2
    assert ids(store) == []
    assert [h for h, _ in store.cancel(Q2, ["c2"], now_ms=NOW)] == ["c2"]  # its owner
    store.promote(Q, NOW, 100)  # x passed on to Q's k3, handed to Q
    assert ids(store) == ["k3"]
    store.promote(Q2, NOW, 100)
    assert ids2(store) == []
    assert check(store).ok


def test_a_lost_dispatch_passes_its_key_to_another_queue(store: Store) -> None:
    configure(store)
    hold(store, "k1", "x")
    [picked] = pick(store, 1)
    store.begin(Q, picked.dispatch_id, NOW + 1_000, now_ms=NOW, run="r", acks_late=False)
    hold2(store, "k2", "x")
    assert ids2(store) == []  # x is in flight in Q
    assert store.reclaim(Q, NOW + 2_000, 100) == (0, 1)
    store.promote(Q2, NOW + 2_001, 100)
    assert ids2(store, NOW + 2_001) == ["k2"]


def test_a_requeued_dispatch_keeps_its_key_across_queues(store: Store) -> None:
    configure(store)
    hold(store, "k1", "x")
    assert ids(store) == ["k1"]  # picked, never confirmed: its lease runs out
    hold2(store, "k2", "x")
    assert store.reclaim(Q, NOW + LEASE + 1, 100) == (1, 0)
    later = NOW + LEASE + 2
    store.promote(Q2, later, 100)
    assert ids2(store, later) == []
    assert ids(store, now=later) == ["k1"]


def test_drop_refuses_while_the_key_waits_in_another_queue(store: Store) -> None:
    configure(store)
    hold(store, "r1", "x", drop=True)  # listed in Q, waiting to be picked
    with pytest.raises(SingletonDropped):
        hold2(store, "r2", "x", drop=True)
    running = dids(store)
    hold2(store, "r3", "x", drop=True)  # r1 runs, none waits: r3 waits in Q2
    with pytest.raises(SingletonDropped):
        hold(store, "r4", "x", drop=True)
    assert store.release(Q, running["r1"])
    store.promote(Q2, NOW, 100)
    assert ids2(store) == ["r3"]


def test_a_delayed_one_waits_for_its_key_in_another_queue_when_due(store: Store) -> None:
    configure(store)
    hold(store, "k1", "x")
    running = dids(store)
    hold2(store, "d1", "x", due=NOW + 1_000)
    assert store.promote(Q2, NOW + 1_000, 100)[0] == 1  # due: waits for x, in flight in Q
    assert ids2(store, NOW + 1_000) == []
    assert store.release(Q, running["k1"])
    store.promote(Q2, NOW + 1_001, 100)
    assert ids2(store, NOW + 1_001) == ["d1"]
