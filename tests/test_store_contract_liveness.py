"""The store contract on every backend (``any_store``; see tests/store_helpers.py): the
dispatchers' heartbeats (``store/beats.py``): beat, list, expiry, prune and forget."""

from __future__ import annotations

import dataclasses

from celery_fair.store.base import PRUNE_GRACE_MS, DispatcherBeat, Store

from .store_helpers import (
    NOW,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)

TTL = 10_000


def beat_of(name: str, queues: tuple[str, ...] = ("fairq",), every: bool = False,
            last_step: int = NOW) -> DispatcherBeat:
    return DispatcherBeat(f"host-{name}:4{len(name)}:ab12", f"host-{name}", 4000 + len(name),
                          NOW - 60_000, last_step, queues, every, "docshop")


def test_a_beat_is_listed_whole_until_it_expires(store: Store) -> None:
    a = beat_of("a", ("fairq", "emoji 😀"))
    b = beat_of("bb", (), every=True)
    assert store.dispatchers(NOW) == []
    store.beat(b, NOW, TTL)
    store.beat(a, NOW + 500, TTL)
    assert store.dispatchers(NOW + 500) == [a, b]  # by id, every field as written
    assert store.dispatchers(NOW + TTL) == [a, b]  # b's last live instant
    assert store.dispatchers(NOW + TTL + 1) == [a]  # b expired; a beat later
    assert store.dispatchers(NOW + 500 + TTL + 1) == []


def test_a_new_beat_replaces_the_last_and_extends_it(store: Store) -> None:
    first = beat_of("a")
    store.beat(first, NOW, TTL)
    later = dataclasses.replace(first, last_step_ms=NOW + 5_000, queues=("fairq", "other"))
    store.beat(later, NOW + 5_000, TTL)
    store.beat(later, NOW + 5_000, TTL)  # a resend changes nothing
    assert store.dispatchers(NOW + TTL + 1) == [later]
    assert store.dispatchers(NOW + 5_000 + TTL + 1) == []


def test_a_clean_stop_forgets_at_once_and_forgetting_again_is_harmless(store: Store) -> None:
    a, b = beat_of("a"), beat_of("bb")
    store.beat(a, NOW, TTL)
    store.beat(b, NOW, TTL)
    store.forget_dispatcher(a.id)
    store.forget_dispatcher(a.id)
    store.forget_dispatcher("never-seen")
    assert store.dispatchers(NOW) == [b]


def test_a_beat_drops_beats_long_expired(store: Store) -> None:
    """Beats expired PRUNE_GRACE_MS before a beat's clock are gone, even to a reader whose
    clock is behind; a younger expired one is kept (another host's clock may still see
    it live)."""
    old, recent, new = beat_of("old"), beat_of("recent"), beat_of("new")
    store.beat(old, NOW, TTL)
    store.beat(recent, NOW + 2_000, TTL)
    store.beat(new, NOW + TTL + PRUNE_GRACE_MS + 1, TTL)
    # old was pruned: not even a reader whose clock is behind sees it
    assert store.dispatchers(NOW) == [new, recent]


def test_serves_names_the_queues_of_a_dispatcher(store: Store) -> None:
    fixed, every = beat_of("a", ("fairq",)), beat_of("bb", (), every=True)
    assert fixed.serves("fairq") and not fixed.serves("other")
    assert every.serves("fairq") and every.serves("other")


def test_flush_keeps_the_heartbeats(store: Store) -> None:
    """A session's dispatcher outlives the pytest plugin's flush between tests."""
    a = beat_of("a")
    store.beat(a, NOW, TTL)
    store.flush()
    assert store.dispatchers(NOW) == [a]
