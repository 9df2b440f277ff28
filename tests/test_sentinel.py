"""The store on Redis Sentinel, on a real topology of the test's own: a master, 2 replicas
and 3 sentinels (celery_fair.testing.SentinelTopology), started once for this module.

The contract suite's dispatch and pick families run again here on the Sentinel store with
fair_store_replicas=1 (each hold, pick, release and cancel WAITs for a replica); the failover
test has a topology of its own, since it kills the master.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, Callable

import pytest
import redis
from celery import Celery

from celery_fair.config import get_config
from celery_fair.errors import ConfigurationError, StoreConnectionError
from celery_fair.store import RedisOptions, SentinelStore, store_for
from celery_fair.store.base import Store
from celery_fair.testing import SentinelTopology

from . import test_store_contract_dispatch, test_store_contract_pick
from .components import REDIS_SENTINEL, require
from .conftest import wait_for
from .store_helpers import (
    Q,
    flushed,
    hold,
    store_fixture,  # noqa: F401 (the contract tests' `store`)
)

# The contract, again on the Sentinel store (this module's any_store): the same functions,
# collected here too.
for _module in (test_store_contract_dispatch, test_store_contract_pick):
    globals().update({name: test for name, test in vars(_module).items()
                      if name.startswith("test_") and callable(test)})


def started_topology() -> Iterator[SentinelTopology]:
    require(REDIS_SENTINEL)  # under CELERY_FAIR_STRICT=1 (CI) a failure, not a skip
    topology = SentinelTopology()
    yield topology
    topology.stop()


@pytest.fixture(scope="module")
def topology() -> Iterator[SentinelTopology]:
    yield from started_topology()


def sentinel_store(topology: SentinelTopology, replicas: int = 1) -> SentinelStore:
    return SentinelStore.from_sentinel_url(
        topology.store_url, "t" + uuid.uuid4().hex[:10], None,
        RedisOptions.of(topology.master_name, replicas=replicas))


@pytest.fixture
def any_store(topology: SentinelTopology) -> Iterator[Store]:
    """The contract suite's store, here on the Sentinel topology's master."""
    yield from flushed(sentinel_store(topology))


def sentinel_app(make_app: Callable[..., Celery], topology: SentinelTopology,
                 **conf: Any) -> Celery:
    """The test project with its fair store behind the topology's sentinels (broker,
    results and ledger stay on the session's plain Redis)."""
    return make_app(fair_store_url=topology.store_url,
                    fair_store_transport_options={"master_name": topology.master_name},
                    **conf)


def test_the_store_writes_on_the_master_the_sentinels_name(topology: SentinelTopology,
                                                           any_store: Store) -> None:
    hold(any_store, "acme")
    master = redis.Redis(port=topology.master_port())
    assert master.keys(f"{any_store.namespace}:{{{Q}}}:*")  # type: ignore[attr-defined]
    assert any_store.where == (f"{topology.store_url} (master {topology.master_name!r})")
    assert not any_store.supports_direct_push  # the broker is never provably the master


def test_the_settings_give_a_sentinel_store_without_direct_push(
        make_app: Callable[..., Celery], topology: SentinelTopology) -> None:
    app = sentinel_app(make_app, topology, fair_store_replicas=1)
    store = store_for(app)
    assert isinstance(store, SentinelStore) and store.replicas == 1
    store.ping()


def test_a_sentinel_broker_is_the_default_store_with_the_broker_s_master_name(
        topology: SentinelTopology) -> None:
    # kombu's own Sentinel URL and transport options, as a Celery user has them already
    broker = ";".join(f"sentinel://127.0.0.1:{port}/0" for port in topology.sentinel_ports)
    app = Celery(set_as_current=False, broker=broker)
    app.conf.broker_transport_options = {"master_name": topology.master_name,
                                         "visibility_timeout": 3600}
    config = get_config(app)
    assert (config.store_url, config.store_master_name) == (broker, topology.master_name)
    store = store_for(app)
    assert isinstance(store, SentinelStore)
    store.ping()


def test_a_sentinel_url_without_a_master_name_is_refused_naming_the_setting(
        make_app: Callable[..., Celery]) -> None:
    app = make_app(fair_store_url="redis+sentinel://:s3cret@127.0.0.1:26379/0")
    with pytest.raises(ConfigurationError) as info:
        get_config(app)
    assert "fair_store_transport_options" in str(info.value)
    assert "master_name" in str(info.value) and "s3cret" not in str(info.value)


def test_an_unreachable_sentinel_store_is_named_without_any_password() -> None:
    from celery_fair.testing import free_port

    store = SentinelStore.from_sentinel_url(
        f"redis+sentinel://:m4ster@127.0.0.1:{free_port()}/0", "t", None,
        RedisOptions.of("svc", {"password": "s3ntinel"}))
    with pytest.raises(StoreConnectionError) as info:
        store.ping()
    text = str(info.value)
    assert "redis+sentinel://127.0.0.1:" in text and "'svc'" in text, text
    assert "m4ster" not in text and "s3ntinel" not in text, text


@pytest.fixture
def failing_topology() -> Iterator[SentinelTopology]:
    """A topology of the test's own: the test kills its master."""
    yield from started_topology()


def test_a_failover_under_a_dispatcher_and_a_worker_runs_every_held_task_once(
        make_app: Callable[..., Celery], worker: Callable[..., Any],
        dispatcher: Callable[..., Any], failing_topology: SentinelTopology) -> None:
    topology = failing_topology
    app = sentinel_app(make_app, topology, fair_store_replicas=1, fair_default_concurrency=2)
    ledger, work = app.ledger, app.tasks["proj.work"]  # type: ignore[attr-defined]
    store, queue = store_for(app), app.conf.task_default_queue
    before = [f"{g}-{i}" for g in ("acme", "globex") for i in range(8)]
    with worker(concurrency=3, the_app=app), dispatcher(app):
        # each hold is on a replica before delay() returns (fair_store_replicas=1)
        results = [work.delay(label.split("-")[0], label, 0.2) for label in before]
        wait_for(lambda: len(ledger.starts()) >= 3, what="tasks to start")
        old = topology.kill_master()  # kill -9, with tasks held, in flight and running
        new = topology.wait_for_failover(old)
        # no restart: the same dispatcher, worker and publisher go on with the new master
        after = [f"initech-{i}" for i in range(4)]
        results += [work.delay("initech", label, 0.05) for label in after]
        labels = before + after
        assert sorted(r.get(timeout=60) for r in results) == sorted(labels)
        wait_for(lambda: store.queue_figures(queue).inflight == 0, timeout=20,
                 what="every slot released on the new master")
    assert ledger.runs() == {label: 1 for label in labels}
    # (the sentinels may have moved on again since: a slow promotion is retried elsewhere)
    assert topology.master_port() != old and new != old
