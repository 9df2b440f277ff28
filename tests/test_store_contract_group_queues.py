"""``fair_group_queues`` in the store contract (``store/routing.py``): a dedicated real
queue is one more target of the routed pick (``queue:<name>``), with its own limit; a
group never spills to or from it, on every backend; a backend of the contract without
routing (``NoRouting``) refuses the setting, naming it and the backend. Settings:
validated, naming the setting."""

from __future__ import annotations

import pytest

from celery_fair.config import FairConfig
from celery_fair.errors import ConfigurationError
from celery_fair.group_queues import dedicated_queue, group_queues_of, queue_of, target
from celery_fair.policies import PolicyChoice, read_policies, routes
from celery_fair.routing import Router
from celery_fair.settings import SETTINGS
from celery_fair.store.base import Store
from celery_fair.store.routing import refuse_group_queues

from .backends import BACKENDS
from .store_helpers import (
    LEASE,
    NOW,
    NoRouting,
    Q,
    group_of,
    hold,
    store_fixture,  # noqa: F401  (the fixture ``store``: any_store)
)

A = "worker-a@host"
VIP, MAIN = target("vip"), target(Q)
ROUTING = BACKENDS
routing = pytest.mark.parametrize("any_store", ROUTING, indirect=True)


def routed(store: Store, limits: dict[str, int], now: int = NOW,
           spill_ms: int | None = None):
    return store.pick_routed(Q, 10, None, now, LEASE, limits, spill_ms)


def test_a_backend_without_routing_refuses_group_queues_naming_setting_and_backend() -> None:
    store = NoRouting("t")
    with pytest.raises(ConfigurationError,
                       match=r"fair_group_queues \(queues 'q1'\).*NoRouting"):
        refuse_group_queues(store, ["q1"])
    with pytest.raises(ConfigurationError, match="fair_group_queues .every fair queue"):
        refuse_group_queues(store, ["*"])
    refuse_group_queues(store, [])  # no queue asks: fine


@routing
def test_a_dedicated_queue_takes_its_groups_up_to_its_own_limit(store: Store) -> None:
    refuse_group_queues(store, ["q1"])  # nothing to refuse
    for n in range(3):
        hold(store, "vip-1", hold_id=f"v-{n}")
        hold(store, "t-1", hold_id=f"t-{n}")
    store.assign(Q, [("vip-1", "", VIP), ("t-1", "", MAIN)])
    got = routed(store, {VIP: 1, MAIN: 5})
    pairs = sorted((group_of(p), w) for p, w in zip(got.picked, got.workers))
    # vip's one slot is taken; the main queue's free slots are not vip's
    assert pairs == [("t-1", MAIN)] * 3 + [("vip-1", VIP)]
    assert store.worker_inflight(Q) == {VIP: 1, MAIN: 3}
    assert routed(store, {VIP: 1, MAIN: 5}).picked == []
    store.release(Q, next(p.dispatch_id for p in got.picked if group_of(p) == "vip-1"))
    again = routed(store, {VIP: 1, MAIN: 5})
    assert [group_of(p) for p in again.picked] == ["vip-1"] and again.workers == [VIP]


@routing
def test_a_group_never_spills_to_or_from_a_dedicated_queue(store: Store) -> None:
    hold(store, "vip-1", hold_id="v-0")
    hold(store, "t-1", hold_id="t-0")
    hold(store, "t-1", hold_id="t-1")
    store.assign(Q, [("vip-1", "", VIP), ("t-1", "", A)])
    limits = {A: 1, VIP: 0}
    first = routed(store, limits)
    assert [group_of(p) for p in first.picked] == ["t-1"]
    # long past the spill time: t-1 may not go to vip's room, vip-1 not to a worker's
    late = routed(store, {A: 1, VIP: 5, "worker-b@host": 5}, now=NOW + 60_000,
                  spill_ms=1_000)
    pairs = sorted((group_of(p), w) for p, w in zip(late.picked, late.workers))
    assert pairs == [("t-1", "worker-b@host"), ("vip-1", VIP)]


def test_the_setting_is_checked_and_first_match_wins() -> None:
    rules = group_queues_of("fair_group_queues", {"vip-0": "main", "vip-*": "vip"})
    assert queue_of(rules, "vip-0") == "main" and queue_of(rules, "vip-7") == "vip"
    assert queue_of(rules, "VIP-7") is None and queue_of(rules, "other") is None
    assert dedicated_queue(target("vip")) == "vip" and dedicated_queue(A) is None
    for bad in (["vip-*"], {"": "vip"}, {"vip-*": ""}, {"vip-*": 3}, {1: "vip"}, "vip"):
        with pytest.raises(ConfigurationError, match=r"setting fair_group_queues=.*expected "
                                                     r"a dict of \{group glob pattern"):
            group_queues_of("fair_group_queues", bad)


def test_per_queue_through_fair_queue_policies() -> None:
    conf = {"fair_group_queues": {}, "fair_queue_policies": {
        "q1": {"fair_group_queues": {"vip-*": "vip"}}}}
    base, per_queue = read_policies(lambda k: conf.get(k, _default(k)), lambda: {"q1"})
    assert base.group_queues == () and not routes(base)
    assert per_queue["q1"].group_queues == (("vip-*", "vip"),) and routes(per_queue["q1"])
    assert per_queue["q1"].describe() == "wfq, queues vip-*→vip"
    conf["fair_queue_policies"] = {"q1": {"fair_group_queues": {"vip-*": None}}}
    with pytest.raises(ConfigurationError,
                       match=r"fair_queue_policies\['q1'\]\['fair_group_queues'\]"):
        read_policies(lambda k: conf.get(k, _default(k)), lambda: {"q1"})
    assert routes(PolicyChoice(affinity="hash"))


def _default(name: str) -> object:
    return next(s.default for s in SETTINGS if s.name == name)


def test_a_dispatcher_s_router_refuses_group_queues_on_a_store_without_routing() -> None:
    base = FairConfig(store_url="memory://", key_prefix="t", default_group="default",
                      default_concurrency=None, group_concurrency={}, group_weights={},
                      default_rate=None, group_rates={}, max_held=None, max_held_overrides={},
                      max_inflight=None, dispatch_ahead=2, interactive_reserve=1,
                      lease_seconds=30, done_ttl=0, batch_size=10, direct_push=False,
                      policy=PolicyChoice(group_queues=(("vip-*", "vip"),)))
    store = NoRouting("t")
    with pytest.raises(ConfigurationError,
                       match="fair_group_queues .every fair queue.*NoRouting.*Redis"):
        Router(lambda: store, base, lambda: 0.0)


def _config(**policy: object) -> FairConfig:
    return FairConfig(store_url="redis://", key_prefix="t", default_group="default",
                      default_concurrency=None, group_concurrency={}, group_weights={},
                      default_rate=None, group_rates={}, max_held=None, max_held_overrides={},
                      max_inflight=None, dispatch_ahead=0, interactive_reserve=1,
                      lease_seconds=30, done_ttl=0, batch_size=10, direct_push=False,
                      policy=PolicyChoice(**policy))  # type: ignore[arg-type]


@routing
@pytest.mark.parametrize("affinity", ["none", "hash"])
def test_the_router_gives_dedicated_groups_their_queue_s_workers_pools(
        store: Store, affinity: str) -> None:
    """The router's targets: the vip workers' pools for "vip" (read from the worker
    registry), the fair queue's room (or, with affinity, its workers) for the others."""
    rules = (("vip-free", Q), ("vip-*", "vip"))  # the fair queue itself: an exemption
    for name, host, pool in ((Q, A, 3), ("vip", "vip-worker@host", 2)):
        store.register_worker(name, host, pool, NOW + 60_000, NOW)
    for n in range(4):
        for group in ("vip-1", "vip-free", "t-1"):
            hold(store, group, hold_id=f"{group}-{n}")
    router = Router(lambda: store, _config(affinity=affinity, group_queues=rules),
                    lambda: 0.0)
    assert router.routes(Q)
    got = router.pick(Q, NOW, 20, 3, LEASE, reclaimed=False)
    main = A if affinity == "hash" else MAIN
    pairs = sorted((group_of(p), w) for p, w in zip(got.picked, got.workers))
    # vip's 2 slots, the rest of the main one's 3 among the two other groups
    assert [p for p in pairs if p[0] == "vip-1"] == [("vip-1", VIP)] * 2
    assert {w for g, w in pairs if g != "vip-1"} == {main} and len(pairs) == 5
    assert store.assignments(Q) == {"vip-1": VIP, "vip-free": main, "t-1": main}
    assert store.worker_inflight(Q) == {VIP: 2, main: 3}

