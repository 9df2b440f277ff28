"""The store contract on every backend (``any_store``; see tests/store_helpers.py): the
worker registry (``store/registry.py``): start times and slots in join order, kept by a
live worker that registers again, freed by one that leaves or expires, never shared."""

from __future__ import annotations

import threading

from celery_fair.store.base import PRUNE_GRACE_MS, Store
from celery_fair.store.models import LiveWorker
from celery_fair.store.registry import slot_table

from .store_helpers import (
    NOW,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)

Q = "fairq"
TTL = 10_000


def register(store: Store, worker: str, at: int, pool: int = 4, queue: str = Q) -> None:
    store.register_worker(queue, worker, pool, at + TTL, at)


def slots(store: Store, at: int, queue: str = Q) -> dict[str, int | None]:
    return {w.hostname: w.slot for w in store.live_workers(queue, at)}


def test_workers_take_slots_in_join_order_and_keep_them(store: Store) -> None:
    assert store.live_workers(Q, NOW) == []
    register(store, "w-a", NOW, pool=2)
    register(store, "w-b", NOW + 100, pool=3)
    register(store, "w-c", NOW + 200)
    for n in range(3):  # renewals keep start and slot, and may change the pool
        register(store, "w-b", NOW + 1000 * (n + 1), pool=5)
        register(store, "w-a", NOW + 1000 * (n + 1), pool=2)
    register(store, "w-c", NOW + 3000)
    assert store.live_workers(Q, NOW + 3000) == [
        LiveWorker("w-a", 2, NOW, 0), LiveWorker("w-b", 5, NOW + 100, 1),
        LiveWorker("w-c", 4, NOW + 200, 2)]
    assert store.worker_pools(Q, NOW + 3000) == {"w-a": 2, "w-b": 5, "w-c": 4}
    assert slot_table(store.live_workers(Q, NOW + 3000)) == ["w-a", "w-b", "w-c"]
    assert store.live_workers("other", NOW) == []  # per fair queue


def test_a_leaving_worker_s_slot_stays_empty_until_the_next_newcomer(store: Store) -> None:
    for n, worker in enumerate(("w-a", "w-b", "w-c")):
        register(store, worker, NOW + n)
    store.unregister_worker(Q, "w-b")
    assert slots(store, NOW + 10) == {"w-a": 0, "w-c": 2}
    assert slot_table(store.live_workers(Q, NOW + 10)) == ["w-a", None, "w-c"]
    register(store, "w-d", NOW + 20)
    register(store, "w-e", NOW + 30)
    assert slots(store, NOW + 30) == {"w-a": 0, "w-d": 1, "w-c": 2, "w-e": 3}
    store.unregister_worker(Q, "w-a")
    store.unregister_worker(Q, "w-a")  # idempotent
    register(store, "w-b", NOW + 40)  # back, as a newcomer: the lowest free slot
    assert store.live_workers(Q, NOW + 40)[0] == LiveWorker("w-b", 4, NOW + 40, 0)


def test_an_expired_worker_s_slot_is_taken_by_the_next_newcomer(store: Store) -> None:
    register(store, "w-a", NOW)
    register(store, "w-b", NOW + 1)
    register(store, "w-a", NOW + TTL)  # renewed; w-b's registration expires at NOW+1+TTL
    later = NOW + TTL + 2  # w-b expired, within PRUNE_GRACE_MS (its entry still kept)
    assert slots(store, later) == {"w-a": 0}
    register(store, "w-c", later)
    assert store.live_workers(Q, later) == [LiveWorker("w-a", 4, NOW, 0),
                                            LiveWorker("w-c", 4, later, 1)]
    register(store, "w-b", later + 1)  # an expired worker comes back as a newcomer
    assert store.live_workers(Q, later + 1)[2] == LiveWorker("w-b", 4, later + 1, 2)
    # long dead: dropped at the next registration, and its slot with it
    gone = later + 1 + TTL + PRUNE_GRACE_MS + 1
    register(store, "w-d", gone)
    assert store.live_workers(Q, gone) == [LiveWorker("w-d", 4, gone, 0)]
    assert store.worker_pools(Q, gone) == {"w-d": 4}


def test_workers_registering_at_once_never_share_a_slot(store: Store) -> None:
    workers = [f"w-{n}" for n in range(8)]
    start = threading.Barrier(len(workers))
    errors: list[BaseException] = []

    def join(worker: str) -> None:
        try:
            start.wait()
            register(store, worker, NOW)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    found = slots(store, NOW)
    assert sorted(found) == workers and sorted(found.values()) == list(range(len(workers)))
    # and a second queue numbers its own slots
    register(store, "w-5", NOW, queue="other")
    assert slots(store, NOW, queue="other") == {"w-5": 0}
