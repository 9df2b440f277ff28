"""The store contract's affinity routing family (``store/routing.py``): the backends that
route (``ROUTING``: every one, Redis, memory and SQL) keep each group's worker and each
worker's routed dispatches in flight, pick a group only while its worker has a slot of
its own (or once it waited the spill time), report groups without a live worker, give a
worker's slot back at release and reclaim; a backend of the contract without routing
(``NoRouting``, a test double) refuses, naming the setting."""

from __future__ import annotations

from collections import Counter

import pytest

from celery_fair.envelope import INTERACTIVE
from celery_fair.errors import ConfigurationError
from celery_fair.store.base import Store
from celery_fair.store.routing import Routing, refuse_affinity

from .backends import BACKENDS
from .store_helpers import (
    LEASE,
    NOW,
    NoRouting,
    Q,
    configure,
    group_of,
    hold,
    klass_of,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)

A, B = "worker-a", "worker-b"
#: The backends with affinity routing: every one.
ROUTING = BACKENDS
routing = pytest.mark.parametrize("any_store", ROUTING, indirect=True)


def routed(store: Store, limits: dict[str, int], limit: int = 10, now: int = NOW,
           spill_ms: int | None = None):
    return store.pick_routed(Q, limit, None, now, LEASE, limits, spill_ms)


@routing
def test_a_backend_with_routing_says_so(store: Store) -> None:
    assert store.supports_affinity
    refuse_affinity(store, ["q1"])  # nothing to refuse


def test_a_backend_without_routing_refuses_it_naming_the_setting() -> None:
    """Every store of celery-fair routes; another backend of the contract keeps the
    default (``Routing``): it refuses, and its reads answer nothing routed."""
    store = NoRouting("t")
    assert not store.supports_affinity
    with pytest.raises(ConfigurationError, match="fair_affinity='hash'.*'q1'.*NoRouting"):
        refuse_affinity(store, ["q1"])
    with pytest.raises(ConfigurationError):
        Routing.pick_routed(store, Q, 1, None, NOW, LEASE, {A: 1}, None)
    refuse_affinity(store, [])  # no queue asks: fine
    hold(store, "g1")
    assert Routing.assignments(store, Q) == {} and Routing.worker_inflight(store, Q) == {}
    assert Routing.affinity_moves(store, Q) == 0


@routing
def test_groups_go_to_their_worker_while_it_has_room(store: Store) -> None:
    for n in range(3):
        hold(store, "g1", hold_id=f"g1-{n}")
        hold(store, "g2", hold_id=f"g2-{n}")
    assert store.assign(Q, [("g1", "", A), ("g2", "", B)]) == 0  # first: no move
    got = routed(store, {A: 2, B: 1})
    pairs = [(group_of(p), w) for p, w in zip(got.picked, got.workers)]
    assert sorted(pairs) == [("g1", A), ("g1", A), ("g2", B)]
    assert got.unassigned == []
    assert store.worker_inflight(Q) == {A: 2, B: 1}
    assert routed(store, {A: 2, B: 1}).picked == []  # both full: g1 and g2 wait
    store.release(Q, got.picked[0].dispatch_id)
    again = routed(store, {A: 2, B: 1})
    freed = got.workers[0]
    assert again.workers == [freed] and store.worker_inflight(Q)[freed] == \
        (2 if freed == A else 1)


@routing
def test_a_full_worker_s_group_waits_while_another_goes_then_spills(store: Store) -> None:
    hold(store, "busy", hold_id="b-0")
    hold(store, "busy", hold_id="b-1")
    hold(store, "other", hold_id="o-0")
    store.assign(Q, [("busy", "", A), ("other", "", B)])
    first = routed(store, {A: 1, B: 2}, limit=1)  # busy's tag is lowest... or other's
    taken = [group_of(p) for p in first.picked]
    rest = routed(store, {A: 1, B: 2})
    taken += [group_of(p) for p in rest.picked]
    # A has one slot: one of busy's two goes, the other waits; other goes to B
    assert sorted(taken) == ["busy", "other"]
    assert store.worker_inflight(Q) == {A: 1, B: 1}
    # no spill time: it keeps waiting; with one, a head that waited that long goes to
    # the worker with the most room
    assert routed(store, {A: 1, B: 2}, now=NOW + 5_000).picked == []
    assert routed(store, {A: 1, B: 2}, now=NOW + 5_000, spill_ms=10_000).picked == []
    spilled = routed(store, {A: 1, B: 2}, now=NOW + 11_000, spill_ms=10_000)
    assert [group_of(p) for p in spilled.picked] == ["busy"] and spilled.workers == [B]
    assert store.worker_inflight(Q) == {A: 1, B: 2}


@routing
def test_groups_without_a_live_worker_are_reported_and_left_held(store: Store) -> None:
    hold(store, "new")
    hold(store, "orphan")
    store.assign(Q, [("orphan", "", "gone-worker")])
    got = routed(store, {A: 4})
    assert got.picked == [] and got.unassigned == ["new", "orphan"]
    assert store.assign(Q, [("new", None, A), ("orphan", None, A)]) == 1  # orphan moved
    assert store.affinity_moves(Q) == 1
    again = routed(store, {A: 4})
    assert sorted(group_of(p) for p in again.picked) == ["new", "orphan"]
    assert again.workers == [A, A] and again.unassigned == []


@routing
def test_assign_applies_only_over_what_was_read_and_drops_forgotten_groups(
        store: Store) -> None:
    hold(store, "g1")
    assert store.assign(Q, [("g1", "", A), ("idle", "", A)]) == 0
    assert store.assignments(Q) == {"g1": A}  # idle holds nothing: not kept
    assert store.assign(Q, [("g1", B, A)]) == 0  # read B, but it is A: unchanged
    assert store.assign(Q, [("g1", A, B)]) == 1
    assert store.assign(Q, [("g1", A, B)]) == 0  # a second dispatcher's same change
    assert store.assignments(Q) == {"g1": B} and store.affinity_moves(Q) == 1
    [p] = routed(store, {B: 1}).picked
    store.release(Q, p.dispatch_id)  # g1 idles and is forgotten
    assert store.assign(Q, [("g1", B, A)]) == 0 and store.assignments(Q) == {}


@routing
def test_reclaim_and_a_lost_dispatch_s_renewal_keep_the_worker_s_count(store: Store) -> None:
    hold(store, "g1", hold_id="x")
    hold(store, "g1", hold_id="y")
    store.assign(Q, [("g1", "", A)])
    got = routed(store, {A: 4})
    assert store.worker_inflight(Q) == {A: 2}
    running = got.picked[1]
    store.confirm(Q, [p.dispatch_id for p in got.picked], NOW + 1_000)
    # acks early: the run keeps no bytes, so its reclaim loses it (the broker owns it)
    store.begin(Q, running.dispatch_id, NOW + 1_000, now_ms=NOW, run="r", acks_late=False)
    assert store.reclaim(Q, NOW + 2_000, 100) == (1, 1)
    assert store.worker_inflight(Q) == {}
    store.renew(Q, [running.dispatch_id], NOW + 60_000)  # its worker was alive after all
    assert store.worker_inflight(Q) == {A: 1}
    store.release(Q, running.dispatch_id)
    assert store.worker_inflight(Q) == {}


@routing
def test_caps_and_the_interactive_class_hold_as_without_affinity(store: Store) -> None:
    configure(store, caps={"capped": 1})
    for n in range(3):
        hold(store, "capped", hold_id=f"c-{n}")
        hold(store, "free", hold_id=f"f-{n}")
    hold(store, "free", klass=INTERACTIVE, hold_id="f-i")
    store.assign(Q, [("capped", "", A), ("free", "", A)])
    got = routed(store, {A: 10})
    order = [(group_of(p), klass_of(p)) for p in got.picked]
    assert order[0] == ("free", INTERACTIVE)  # interactive first, across groups
    assert Counter(g for g, _ in order) == {"capped": 1, "free": 4}  # capped at its cap
    assert store.worker_inflight(Q) == {A: 5}


@routing
def test_a_pick_looks_past_many_groups_of_a_full_worker(store: Store) -> None:
    """More groups of a full worker at the front of the set than the pick reads at once
    (the SQL store reads the rows past ``want`` a page at a time): the one group of a
    worker with room further back still goes, and the unassigned ones met are reported."""
    hold(store, "a-first", hold_id="first")
    store.assign(Q, [("a-first", "", A)])
    assert len(routed(store, {A: 1, B: 1}, limit=1).picked) == 1  # A is full now
    for n in range(70):
        hold(store, f"a-{n:02}")
    hold(store, "b-last")
    hold(store, "c-none")
    store.assign(Q, [(f"a-{n:02}", "", A) for n in range(70)] + [("b-last", "", B)])
    got = routed(store, {A: 1, B: 1}, limit=2)
    assert [group_of(p) for p in got.picked] == ["b-last"] and got.workers == [B]
    assert got.unassigned == []  # the pick stopped at b-last: no target had room after
    hold(store, "b-last", hold_id="b-again")
    store.release(Q, got.picked[0].dispatch_id)
    again = routed(store, {A: 1, B: 1}, limit=2)
    assert [group_of(p) for p in again.picked] == ["b-last"]
    assert store.worker_inflight(Q) == {A: 1, B: 1}
    store.release(Q, again.picked[0].dispatch_id)
    assert routed(store, {A: 1, B: 1}, limit=2).unassigned == ["c-none"]


@routing
def test_no_live_target_takes_nothing(store: Store) -> None:
    """Every worker gone: nothing goes anywhere (the Redis store picked unrouted, and
    misread the answer, when given no target)."""
    hold(store, "g1")
    store.assign(Q, [("g1", "", A)])
    got = store.pick_routed(Q, 10, None, NOW, LEASE, {}, None, promote=True)
    assert got.picked == [] and got.workers == [] and got.unassigned == []
    assert store.queue_figures(Q).held == 1 and store.worker_inflight(Q) == {}


@routing
@pytest.mark.parametrize("step", ["another task", "a new cap"])
def test_a_group_looked_past_keeps_its_first_tag_when_more_work_arrives(
        store: Store, step: str) -> None:
    """A group whose target stayed full while the virtual time passed it keeps its place
    (a member of the ready set keeps its tag, even the first one, never set: 0) at its
    next refresh: a hold into it, or its cap changed. The SQLite model test's divergence
    (ready 1.0 against 0.0): the memory store moved it to the virtual time at a hold,
    the SQL stores at a new cap; Redis kept 0."""
    hold(store, "z", hold_id="z-0")
    hold(store, "c", hold_id="c-0")
    hold(store, "c", hold_id="c-1")
    store.assign(Q, [("z", "", A), ("c", "", B)])
    passed = routed(store, {A: 0, B: 5}, limit=2)  # z looked past; the virtual time 1
    assert [group_of(p) for p in passed.picked] == ["c", "c"]
    if step == "another task":
        hold(store, "z", hold_id="z-1")  # z is in the ready set still, at 0
    else:
        store.limit(Q, "z", 3)
    hold(store, "e", hold_id="e-0")  # e enters at the virtual time, 1
    store.assign(Q, [("e", "", A)])
    got = routed(store, {A: 1, B: 5}, limit=1)
    assert [group_of(p) for p in got.picked] == ["z"]
