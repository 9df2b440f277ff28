"""Resharding a Redis Cluster under the store: a fair queue's slot migrating
(``CLUSTER SETSLOT <slot> MIGRATING/IMPORTING``, as ``redis-cli --cluster reshard`` does
before it moves the keys), and the set of fair queues (``<ns>:queues``, a slot of its
own) out of step with the queues. On a real cluster of this module's own
(celery_fair.testing.ClusterTopology)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable

import pytest
import redis
from celery import Celery
from redis.cluster import key_slot

from celery_fair.check import check
from celery_fair.dispatcher import Dispatcher
from celery_fair.errors import SlotMigrating, StoreConnectionError
from celery_fair.store import store_for
from celery_fair.store.base import BeginResult, Store
from celery_fair.store.keys import queues_key
from celery_fair.testing import ClusterTopology

from .store_helpers import NOW, flushed
from .test_cluster import SPREAD, cluster, cluster_store, held  # noqa: F401 (fixture)


@pytest.fixture
def any_store(cluster: ClusterTopology) -> Iterator[Store]:  # noqa: F811
    yield from flushed(cluster_store(cluster))


@contextmanager
def migrating(cluster: ClusterTopology, key: str) -> Iterator[tuple[int, redis.Redis]]:  # noqa: F811, E501
    """``key``'s slot marked as migrating from its primary to another one; the
    migration is called off at the end. Yields the slot and the importing node."""
    slot = key_slot(key.encode())
    source_port = cluster.primary_of(key)
    source = redis.Redis(port=source_port)
    target = redis.Redis(port=next(p for p in cluster.primaries() if p != source_port))
    target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING",
                           source.execute_command("CLUSTER", "MYID"))
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING",
                           target.execute_command("CLUSTER", "MYID"))
    try:
        yield slot, target
    finally:
        source.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        target.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")


def test_a_queue_whose_slot_migrates_waits_and_writes_nothing_on_the_importing_node(
        cluster: ClusterTopology, any_store: Store) -> None:  # noqa: F811
    """Its scripts declare only the queue's prefix, never stored: the migrating node
    answers ASK to each. Followed, they would run on the importing node, which has none
    of the queue's keys (a begin of an unknown dispatch runs the task uncounted, a
    release does nothing, a write there fails the migration)."""
    held(any_store, "alpha", hold_id="first")
    [picked] = any_store.pick("alpha", 10, None, NOW, 60_000)
    did, later = picked.dispatch_id, NOW + 60_000
    with migrating(cluster, any_store.keys("alpha").prefix) as (slot, importing):
        with pytest.raises(SlotMigrating, match="migrating"):
            any_store.begin_run("alpha", did, later, now_ms=NOW, run="r1", acks_late=False)
        with pytest.raises(SlotMigrating):
            any_store.release("alpha", did)
        with pytest.raises(SlotMigrating):  # refused unrun: not held (not "unknown")
            held(any_store, "alpha", hold_id="second")
        with pytest.raises(SlotMigrating):
            any_store.promote_reclaim_pick("alpha", NOW, 10, None, 60_000, None, later)
        assert importing.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        assert any_store.queues() == ["alpha"]
    begun = any_store.begin_run("alpha", did, later, now_ms=NOW, run="r1", acks_late=False)
    assert begun.result is BeginResult.RUN
    assert any_store.queue_figures("alpha").inflight == 1


def test_a_dispatcher_goes_on_with_other_queues_while_one_slot_migrates(
        make_app: Callable[..., Celery], cluster: ClusterTopology,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="celery_fair")
    app = make_app(fair_store_url=cluster.store_url, fair_max_inflight=10)
    store, work = store_for(app), app.tasks["proj.work"]
    # queues of this test only (no worker of another test consumes what it publishes)
    moving = f"moving-{uuid.uuid4().hex[:8]}"
    staying = next(q for q in (f"staying-{uuid.uuid4().hex[:8]}" for _ in range(100))
                   if key_slot(q.encode()) != key_slot(moving.encode()))
    for queue in (moving, staying):
        work.apply_async(("acme", f"{queue}-1", 0), queue=queue)
    stepper = Dispatcher(app)
    try:
        assert stepper.step().by_queue == {moving: 1, staying: 1}
        for queue in (moving, staying):
            work.apply_async(("acme", f"{queue}-2", 0), queue=queue)
        with migrating(cluster, store.keys(moving).prefix):  # type: ignore[attr-defined]
            assert stepper.step().by_queue == {staying: 1}
            assert f"queue {moving}: not dispatched while its slot migrates" in caplog.text
        assert stepper.step().by_queue == {moving: 1, staying: 0}
        assert f"queue {moving}: its slot migrated, dispatched again" in caplog.text
        # Its workers could not renew their leases meanwhile: as after an outage, its
        # reclaim waits half a lease for their lease keepers; the other queue's does not.
        stepper.clock = lambda: time.monotonic() + 1.0
        assert not stepper._reclaim_due(moving, None) and stepper._reclaim_due(staying, None)
    finally:
        stepper.close()
        with app.connection_for_write() as connection:
            for queue in (moving, staying):
                connection.default_channel.queue_purge(queue)


def test_forget_keeps_a_queue_whose_slot_migrates_and_check_finds_one_lost(
        cluster: ClusterTopology, any_store: Store) -> None:  # noqa: F811
    held(any_store, "alpha")
    with migrating(cluster, any_store.keys("alpha").prefix):
        with pytest.raises(StoreConnectionError):
            any_store.forget_queue("alpha")  # the ask failed: put back
        assert any_store.queues() == ["alpha"]
    # A process killed between forget's SREM and its SADD: held work, no queue.
    any_store.client.srem(queues_key(any_store.namespace), "alpha")  # type: ignore[attr-defined]
    report = check(any_store)
    assert [(f.queue, f.kind, f.repaired) for f in report.findings] == [
        ("alpha", "queue_unregistered", False)]
    assert any_store.queues() == []
    assert not check(any_store, repair=True).problems
    assert any_store.queues() == ["alpha"] and check(any_store).ok


def test_a_hold_whose_registration_fails_is_held_and_check_registers_its_queue(
        cluster: ClusterTopology, any_store: Store,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    """The hold's SADD is a round trip after its script: the task is held whatever the
    SADD's fate, so the hold neither fails nor is reported unknown."""
    key = queues_key(any_store.namespace)
    owner = redis.Redis(port=cluster.primary_of(key))
    queue = next(q for q in SPREAD if cluster.primary_of(any_store.keys(q).prefix)
                 != cluster.primary_of(key))
    owner.config_set("maxmemory", 1)  # every write refused there (out of memory)
    try:
        held(any_store, queue, hold_id="kept")
    finally:
        owner.config_set("maxmemory", 0)
    assert f"fair queue {queue} holds a task but could not be added" in caplog.text
    assert any_store.queues() == []
    assert check(any_store, repair=True).kinds() == {"queue_unregistered"}
    assert any_store.queues() == [queue]
    assert [p.hold_id for p in any_store.pick(queue, 10, None, NOW, 60_000)] == ["kept"]
