"""The store contract on every backend (``any_store``): the interactive share
(``fair_interactive_share``). While background work waits, interactive work holds at
most its share of the capacity and background gets the rest; without background work
waiting interactive may use all of it; without a share (the default) interactive goes
first, strictly."""

from __future__ import annotations

import pytest

from celery_fair.envelope import BACKGROUND, INTERACTIVE
from celery_fair.errors import InvalidLimit
from celery_fair.store.base import Picked, Policy, Store
from celery_fair.store.models import WFQ

from .store_helpers import (
    LEASE,
    NOW,
    Q,
    each_policy,
    hold,
    klass_of,
    pick,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)

GROUPS = ["a", "b", "c"]


def shared(store: Store, share: float | None, policy: str = WFQ) -> None:
    store.configure(Q, Policy(None, 0, 1.0, {}, {}, name=policy, interactive_share=share))


def backlog(store: Store, klass: str, n: int) -> None:
    for i in range(n):
        hold(store, GROUPS[i % len(GROUPS)], klass)


def classes(picked: list[Picked]) -> list[str]:
    return [klass_of(p) for p in picked]


@each_policy
def test_interactive_holds_its_share_while_background_waits(store: Store,
                                                             policy: str) -> None:
    shared(store, 0.8, policy)
    backlog(store, INTERACTIVE, 20)
    backlog(store, BACKGROUND, 20)
    got = pick(store, 10, capacity=10)
    assert classes(got).count(INTERACTIVE) == 8
    assert classes(got).count(BACKGROUND) == 2
    # a slot of each class frees: the share is used again at once
    store.release(Q, next(p for p in got if klass_of(p) == INTERACTIVE).dispatch_id)
    store.release(Q, next(p for p in got if klass_of(p) == BACKGROUND).dispatch_id)
    assert sorted(classes(pick(store, 10, capacity=10))) == [BACKGROUND, INTERACTIVE]
    # slots freed by background work go to background while interactive holds its share
    for p in got:
        if klass_of(p) == BACKGROUND:
            store.release(Q, p.dispatch_id)
    assert classes(pick(store, 10, capacity=10)) == [BACKGROUND]


def test_interactive_may_use_all_without_background_waiting(store: Store) -> None:
    shared(store, 0.8)
    backlog(store, INTERACTIVE, 20)
    assert classes(pick(store, 10, capacity=10)) == [INTERACTIVE] * 10
    backlog(store, BACKGROUND, 5)
    assert pick(store, 10, capacity=10) == []  # full: nothing is preempted


def test_background_gets_slots_as_interactive_ones_free(store: Store) -> None:
    shared(store, 0.5)
    backlog(store, INTERACTIVE, 20)
    first = pick(store, 4, capacity=4)
    assert classes(first) == [INTERACTIVE] * 4
    backlog(store, BACKGROUND, 10)
    # 4 interactive in flight, over half of 4: every freed slot goes to background
    # until interactive is down to its share
    for p in first[:2]:
        store.release(Q, p.dispatch_id)
        assert classes(pick(store, 1, capacity=4)) == [BACKGROUND]
    store.release(Q, first[2].dispatch_id)
    assert classes(pick(store, 1, capacity=4)) == [INTERACTIVE]  # 1 < 2: its share again


def test_without_a_share_interactive_goes_first_strictly(store: Store) -> None:
    shared(store, None)
    backlog(store, INTERACTIVE, 20)
    backlog(store, BACKGROUND, 20)
    assert classes(pick(store, 10, capacity=10)) == [INTERACTIVE] * 10


def test_a_share_without_a_capacity_changes_nothing(store: Store) -> None:
    shared(store, 0.5)
    backlog(store, INTERACTIVE, 5)
    backlog(store, BACKGROUND, 5)
    assert classes(pick(store, 6)) == [INTERACTIVE] * 5 + [BACKGROUND]


def test_a_reclaimed_interactive_slot_counts_no_more(store: Store) -> None:
    shared(store, 0.5)
    backlog(store, INTERACTIVE, 4)
    backlog(store, BACKGROUND, 4)
    got = pick(store, 4, capacity=4)
    assert sorted(classes(got)) == [BACKGROUND, BACKGROUND, INTERACTIVE, INTERACTIVE]
    assert store.reclaim(Q, NOW + LEASE + 1, 100) == (4, 0)  # none was published
    # every slot is free again and the messages held again: the share starts over
    assert sorted(classes(pick(store, 4, capacity=4))) == \
        [BACKGROUND, BACKGROUND, INTERACTIVE, INTERACTIVE]


def test_a_lost_interactive_slot_taken_again_counts_again(store: Store) -> None:
    shared(store, 0.5)
    backlog(store, INTERACTIVE, 6)
    got = pick(store, 2, capacity=4)
    for p in got:  # begun by a worker, then its lease runs out: lost, not held again
        store.confirm(Q, [p.dispatch_id], NOW + LEASE)
        store.begin_run(Q, p.dispatch_id, NOW + LEASE, now_ms=NOW, run="r", acks_late=False)
    assert store.reclaim(Q, NOW + LEASE + 1, 100) == (0, 2)
    for p in got:  # the broker redelivers them: they take their slots again
        store.renew(Q, [p.dispatch_id], NOW + 2 * LEASE)
    backlog(store, BACKGROUND, 4)
    # two interactive in flight again, half of 4: background first
    assert classes(pick(store, 2, capacity=4)) == [BACKGROUND, BACKGROUND]



@pytest.mark.parametrize("share", [0, 1.5, -0.2, float("nan")])
def test_a_share_out_of_range_is_refused(store: Store, share: float) -> None:
    shared(store, None)
    before = store.snapshot(Q)
    with pytest.raises(InvalidLimit, match="interactive share must be None"):
        shared(store, share)
    assert store.snapshot(Q) == before
