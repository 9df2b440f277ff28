"""The store contract on every backend (``any_store``; see tests/store_helpers.py):
pauses (``store/pausing.py``): a paused group leaves the ready sets in both classes and
comes back on resume or expiry; a paused queue gives the pick nothing; a cap set
meanwhile is kept."""

from __future__ import annotations

import pytest

from celery_fair.check import check
from celery_fair.errors import InvalidGroup
from celery_fair.policy.decisions import INTERACTIVE
from celery_fair.store.base import Store
from celery_fair.store.pausing import WHOLE_QUEUE

from .store_helpers import (
    NOW,
    Q,
    group_of,
    hold,
    pick,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)


def picked(store: Store) -> list[str]:
    """The groups of everything one pick takes now (up to 10), sorted."""
    return sorted(group_of(p) for p in pick(store, 10))


def test_a_paused_group_is_not_picked_in_either_class_until_resumed(store: Store) -> None:
    hold(store, "acme", klass=INTERACTIVE)
    hold(store, "acme")
    hold(store, "globex")
    store.pause(Q, "acme", None)
    assert store.pauses(Q) == {"acme": None}
    hold(store, "acme", klass=INTERACTIVE)  # newly held work waits too
    report = check(store, queues=[Q])  # fair check: a paused group is rightly not ready
    assert report.ok, str(report)
    assert picked(store) == ["globex"]
    assert store.resume(Q, "acme") is True
    assert store.resume(Q, "acme") is False  # a resend changes nothing
    assert store.pauses(Q) == {}
    assert picked(store) == ["acme", "acme", "acme"]


def test_a_pause_is_not_a_cap_and_a_cap_set_meanwhile_is_kept(store: Store) -> None:
    for _ in range(3):
        hold(store, "acme")
    store.pause(Q, "acme", None)
    assert store.limit(Q, "acme", 1) == (1, 1.0)  # the cap in force, not 0
    assert picked(store) == []
    store.resume(Q, "acme")
    assert picked(store) == ["acme"]  # the cap of 1 holds


def test_a_pause_with_an_end_is_lifted_when_expired(store: Store) -> None:
    hold(store, "acme")
    hold(store, "globex")
    store.pause(Q, "acme", NOW + 1_000)
    store.pause(Q, "globex", NOW + 5_000)
    assert store.pauses(Q) == {"acme": NOW + 1_000, "globex": NOW + 5_000}
    assert store.expire_pauses(Q, NOW + 999) == []
    assert picked(store) == []
    assert store.expire_pauses(Q, NOW + 1_000) == ["acme"]
    assert store.pauses(Q) == {"globex": NOW + 5_000}
    assert picked(store) == ["acme"]
    store.pause(Q, "globex", None)  # again: replaces the end
    assert store.expire_pauses(Q, NOW + 10_000) == []


def test_a_paused_queue_gives_nothing_to_the_pick(store: Store) -> None:
    hold(store, "acme")
    store.pause(Q, WHOLE_QUEUE, NOW + 1_000)
    hold(store, "globex", klass=INTERACTIVE)
    assert picked(store) == []
    assert store.pauses(Q) == {WHOLE_QUEUE: NOW + 1_000}
    assert store.expire_pauses(Q, NOW + 2_000) == [WHOLE_QUEUE]
    assert picked(store) == ["acme", "globex"]


def test_a_bad_group_is_refused(store: Store) -> None:
    with pytest.raises(InvalidGroup):
        store.pause(Q, "bad\x00group", None)
    assert store.pauses(Q) == {}
