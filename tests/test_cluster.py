"""The store on Redis Cluster, on a real cluster of the test's own: 3 primaries with a
replica each (celery_fair.testing.ClusterTopology), started once for this module.

The whole store contract runs again here on the cluster store; then what a cluster
changes: keys per slot, wake-ups across slots, check and flush over every primary,
``--shard``, a dispatcher with a real worker, and a failover (on a cluster of its own).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import redis
from celery import Celery
from click.testing import CliRunner
from redis.cluster import key_slot

from celery_fair.check import check
from celery_fair.cli_dispatch import dispatch
from celery_fair.config import get_config
from celery_fair.errors import ConfigurationError, InvalidLimit, StoreConnectionError
from celery_fair.shards import Shard, parse_shard
from celery_fair.store import ClusterStore, RedisOptions, store_for
from celery_fair.store.base import Store
from celery_fair.store.models import Placement, Policy
from celery_fair.testing import ClusterTopology

from . import (
    test_store_contract_audit,
    test_store_contract_backpressure,
    test_store_contract_boost,
    test_store_contract_bulk,
    test_store_contract_dispatch,
    test_store_contract_interactive_share,
    test_store_contract_liveness,
    test_store_contract_pause,
    test_store_contract_pick,
    test_store_contract_policy,
    test_store_contract_position,
    test_store_contract_rate,
    test_store_contract_singleton,
    test_store_contract_softcap,
)
from .components import REDIS_CLUSTER, require
from .conftest import wait_for
from .store_helpers import (
    NOW,
    Q,
    flushed,
    store_fixture,  # noqa: F401 (the contract tests' `store`)
    value,
)

# Singleton keys (not the SQL damage test): their keys share the queue's hash tag, so a
# key's scope is its queue (not the app: APP_SCOPE's tests are left out).
globals().update({name: test for name, test in vars(test_store_contract_singleton).items()
                  if name.startswith("test_") and callable(test) and "sql" not in name
                  and name not in test_store_contract_singleton.APP_SCOPE})


def test_a_singleton_keys_scope_is_its_queue_on_a_cluster(store: Any) -> None:
    """A script reaches one slot: a key's tasks in two queues do not wait for each
    other there (docs/singletons.md, Limits)."""
    hold, hold2 = test_store_contract_singleton.hold, test_store_contract_singleton.hold2
    hold(store, "k1", "x")
    assert [p.hold_id for p in store.pick(Q, 10, None, NOW, 10_000)] == ["k1"]
    hold2(store, "k2", "x")
    assert [p.hold_id for p in store.pick("fairq2", 10, None, NOW, 10_000)] == ["k2"]


def test_the_app_scope_is_refused_on_a_cluster(store: Any) -> None:
    """fair_scope 'app' counts across queues, which a script on a cluster cannot reach:
    refused before anything is written (docs/policies.md, "One cap across queues")."""
    with pytest.raises(InvalidLimit, match="scope 'app'.*Redis Cluster"):
        store.configure(Q, Policy(None, 0, 1.0, {"g": 1}, {}, scope="app"))
    store.configure(Q, Policy(None, 0, 1.0, {"g": 1}, {}, scope="queue"))

# The whole contract, again on the cluster store (this module's any_store): every script
# and every namespace-level key runs on a real cluster.
for _module in (test_store_contract_audit, test_store_contract_backpressure,
                test_store_contract_boost, test_store_contract_bulk,
                test_store_contract_dispatch, test_store_contract_interactive_share,
                test_store_contract_liveness, test_store_contract_pause,
                test_store_contract_pick, test_store_contract_policy,
                test_store_contract_position, test_store_contract_rate,
                test_store_contract_softcap):
    globals().update({name: test for name, test in vars(_module).items()
                      if name.startswith("test_") and callable(test)})

#: Queue names whose slots fall on each of the 3 primaries of a fresh cluster
#: (redis-cli gives them slots 0-5460, 5461-10922, 10923-16383).
SPREAD = ("alpha", "bravo", "echo", "charlie", "delta", "golf")


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterTopology]:
    require(REDIS_CLUSTER)  # under CELERY_FAIR_STRICT=1 (CI) a failure, not a skip
    topology = ClusterTopology()
    yield topology
    topology.stop()


def cluster_store(cluster: ClusterTopology, replicas: int = 0) -> ClusterStore:
    return ClusterStore.from_cluster_url(cluster.store_url, "t" + uuid.uuid4().hex[:10],
                                         None, RedisOptions.of(replicas=replicas))


@pytest.fixture
def any_store(cluster: ClusterTopology) -> Iterator[Store]:
    """The contract suite's store, here on the cluster."""
    yield from flushed(cluster_store(cluster))


def keys_by_port(cluster: ClusterTopology, pattern: str) -> dict[int, list[bytes]]:
    """The keys matching ``pattern`` on each primary that has any."""
    found = {}
    for port in cluster.primaries():
        keys = list(redis.Redis(port=port).scan_iter(match=pattern, count=1000))
        if keys:
            found[port] = keys
    return found


def held(store: Store, queue: str, group: str = "acme", hold_id: str | None = None) -> None:
    hid = hold_id or uuid.uuid4().hex
    store.hold(queue, hid, value(group, body=hid.encode()), Placement(group, "b", 1, False),
               0, NOW)


def test_the_settings_give_a_cluster_store_without_direct_push(
        make_app: Callable[..., Celery], cluster: ClusterTopology) -> None:
    store = store_for(make_app(fair_store_url=cluster.store_url))
    assert isinstance(store, ClusterStore) and not store.supports_direct_push
    assert not store.same_redis({"host": "127.0.0.1", "port": cluster.primaries()[0]})
    store.ping()
    assert store.where == cluster.store_url


def test_a_cluster_url_with_another_database_is_refused_naming_the_setting(
        make_app: Callable[..., Celery]) -> None:
    app = make_app(fair_store_url="redis+cluster://:s3cret@127.0.0.1:7000,127.0.0.1:7001/2")
    with pytest.raises(ConfigurationError) as info:
        get_config(app)
    text = str(info.value)
    assert "fair_store_url" in text and "only database 0" in text, text
    assert "s3cret" not in text, text


def test_each_fair_queue_is_on_one_primary_and_the_queues_spread_over_all(
        cluster: ClusterTopology, any_store: Store) -> None:
    ns = any_store.namespace
    for queue in SPREAD:
        for group in ("acme", "globex", "{odd}"):
            held(any_store, queue, group)
    ports = set()
    for queue in SPREAD:
        where = keys_by_port(cluster, f"{ns}:{{{queue}}}:*")
        assert len(where) == 1, f"{queue}: keys on {sorted(where)}"
        ports |= set(where)
    assert ports == set(cluster.primaries())
    assert len({key_slot(f"{ns}:{{{q}}}".encode()) // 5461 for q in SPREAD}) == 3
    assert any_store.queues() == sorted(SPREAD)


def test_wait_takes_wake_ups_of_queues_in_different_slots(any_store: Store) -> None:
    queues = list(SPREAD[:3])
    held(any_store, queues[0])
    held(any_store, queues[2])
    assert any_store.wait(queues, 0) == {queues[0], queues[2]}
    started = time.monotonic()
    assert any_store.wait(queues, 0.3) == set()
    assert time.monotonic() - started >= 0.3
    timer = threading.Timer(0.2, held, (any_store, queues[1]))
    timer.start()
    try:
        assert any_store.wait(queues, 3) == {queues[1]}
    finally:
        timer.join()
    timer = threading.Timer(0.2, held, (any_store, queues[1], "initech"))  # a new group
    timer.start()
    try:  # one queue: a blocking BLPOP on its key
        assert any_store.wait(queues[1:2], 3) == {queues[1]}
    finally:
        timer.join()


def test_check_and_flush_cover_every_primary(cluster: ClusterTopology,
                                             any_store: Store) -> None:
    ns = any_store.namespace
    for queue in SPREAD:
        held(any_store, queue, "[x]")
        held(any_store, queue, "c:d")
    assert check(any_store).ok
    for queue in SPREAD:  # only the key scan of the queue's primary finds these now
        any_store.client.srem(any_store.keys(queue).groups, "[x]")  # type: ignore[attr-defined]
    report = check(any_store)
    assert {(f.queue, f.kind, f.subject) for f in report.findings} == {
        (queue, "group_unregistered", "[x]") for queue in SPREAD}
    assert not check(any_store, repair=True).problems and check(any_store).ok
    any_store.flush()
    assert keys_by_port(cluster, f"{ns}:*") == {}
    assert any_store.queues() == []


def test_forget_keeps_a_queue_that_holds_and_drops_an_empty_one(any_store: Store) -> None:
    held(any_store, "alpha")
    assert not any_store.forget_queue("alpha") and any_store.queues() == ["alpha"]
    any_store.register_worker("bravo", "w1", 1, NOW + 60_000, NOW)
    any_store.client.sadd(f"{any_store.namespace}:queues", "bravo")  # type: ignore[attr-defined]
    assert any_store.forget_queue("bravo") and any_store.queues() == ["alpha"]


def test_a_hold_waits_for_a_replica_of_its_queue_s_primary(cluster: ClusterTopology) -> None:
    store = cluster_store(cluster, replicas=1)
    try:
        for queue in SPREAD[:3]:
            held(store, queue)  # WAIT 1 on the primary of each queue's slot
        assert store.queues() == sorted(SPREAD[:3])
    finally:
        store.flush()
        store.close()


def test_shards_split_the_queues_and_bad_shards_are_refused(
        make_app: Callable[..., Celery], cluster: ClusterTopology) -> None:
    names = [f"queue-{i}" for i in range(60)]
    shards = [Shard(i, 3) for i in range(3)]
    served = [[q for q in names if shard.serves(q)] for shard in shards]
    assert sorted(q for part in served for q in part) == sorted(names)  # each exactly once
    assert all(len(part) >= 10 for part in served), [len(p) for p in served]
    assert parse_shard("2/3") == Shard(2, 3)
    app = make_app(fair_store_url=cluster.store_url)
    for bad in ("3/3", "0/0", "1", "a/b", "-1/2"):
        result = CliRunner().invoke(dispatch, ["--shard", bad, "--once"],
                                    obj=_context(app))
        assert result.exit_code == 2 and "--shard" in result.output, result.output


def test_sharded_dispatchers_each_serve_only_their_queues(
        make_app: Callable[..., Celery], dispatcher: Callable[..., Any],
        cluster: ClusterTopology, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="celery_fair")
    app = make_app(fair_store_url=cluster.store_url)
    store = store_for(app)
    for queue in SPREAD:
        held(store, queue)
    for index in range(2):
        shard = Shard(index, 2)
        with dispatcher(app, shard=shard) as running:
            wait_for(lambda: running.directory.queues, what="the shard's queues")
            mine = [q for q in sorted(SPREAD) if shard.serves(q)]
            assert running.directory.queues == mine
            assert f"queues shard {shard} of the fair queues (now: {', '.join(mine)})" \
                in caplog.text


def test_a_dispatcher_and_a_worker_run_tasks_of_several_queues_on_the_cluster(
        make_app: Callable[..., Celery], worker: Callable[..., Any],
        dispatcher: Callable[..., Any], cluster: ClusterTopology) -> None:
    app = make_app(fair_store_url=cluster.store_url, fair_default_concurrency=2)
    ledger, work = app.ledger, app.tasks["proj.work"]  # type: ignore[attr-defined]
    queues = list(SPREAD[:3])  # one per primary (the namespace is the test's own)
    store = store_for(app)
    labels = [f"{q}:{g}-{i}" for q in queues for g in ("acme", "globex") for i in range(4)]
    with worker(concurrency=4, the_app=app, queues=queues), dispatcher(app):
        results = [work.apply_async((label.split(":")[1].split("-")[0], label, 0.01),
                                    queue=label.split(":")[0]) for label in labels]
        assert sorted(r.get(timeout=60) for r in results) == sorted(labels)
        wait_for(lambda: all(store.queue_figures(q).inflight == 0 for q in queues),
                 timeout=20, what="every slot released")
    assert ledger.runs() == {label: 1 for label in labels}


def _context(app: Celery) -> Any:
    class Obj:
        pass

    obj = Obj()
    obj.app = app  # type: ignore[attr-defined]
    return obj


def test_an_unreachable_cluster_store_is_named_without_its_password() -> None:
    from celery_fair.testing import free_port

    store = ClusterStore.from_cluster_url(
        f"redis+cluster://:s3cret@127.0.0.1:{free_port()}/", "t", None, RedisOptions())
    with pytest.raises(StoreConnectionError) as info:
        store.ping()
    text = str(info.value)
    assert "redis+cluster://127.0.0.1:" in text and "s3cret" not in text, text


@pytest.fixture
def failing_cluster() -> Iterator[ClusterTopology]:
    """A cluster of the test's own: the test kills a primary."""
    require(REDIS_CLUSTER)
    topology = ClusterTopology()
    yield topology
    topology.stop()


def test_the_same_store_follows_a_failover_of_its_queue_s_primary(
        failing_cluster: ClusterTopology) -> None:
    replicated, store = cluster_store(failing_cluster, replicas=1), cluster_store(failing_cluster)
    store.namespace = replicated.namespace  # the same fair queues, with and without WAIT
    held(replicated, "alpha", "acme", "before")  # on the replica before hold returns
    assert store.queues() == ["alpha"]  # the store is connected to the old primary
    old = failing_cluster.primary_of(replicated.keys("alpha").prefix)
    failing_cluster.kill(old)
    failing_cluster.wait_for_failover(old)
    held(store, "alpha", "globex", "after")  # no restart: the same client finds the new one
    picked = store.pick("alpha", 10, None, NOW, 10_000)
    assert sorted(p.hold_id for p in picked) == ["after", "before"]
    assert failing_cluster.primary_of(store.keys("alpha").prefix) != old
