"""``fair_assign`` (``assign.py``) and the router's refusal of a store without affinity:
the app's function chooses a group's worker; None, an unknown hostname or an error (logged
once per burst) fall back to the consistent hash. Unit tests: pure functions and the
memory store."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest

from celery_fair.affinity import owner
from celery_fair.assign import Assigner, AssignWorker, assign_ref, load_assign
from celery_fair.config import FairConfig
from celery_fair.errors import ConfigurationError
from celery_fair.policies import PolicyChoice
from celery_fair.routing import Router

from .store_helpers import NoRouting

TABLE = ["w-a", None, "w-c"]
WORKERS = [AssignWorker("w-a", datetime(2026, 1, 1, tzinfo=timezone.utc), 4, ("q",)),
           AssignWorker("w-c", None, 2, ("q",))]
GROUPS = [f"tenant-{n}" for n in range(50)]


def vip_on_c(group: str, workers: list[AssignWorker]) -> str | None:
    """An app's function: VIP groups to the worker with the biggest... w-c; others: hash."""
    return "w-c" if group.startswith("vip") else None


def test_the_function_s_choice_wins_and_none_leaves_the_group_to_the_hash() -> None:
    assigner = Assigner(vip_on_c)
    assert assigner.owner("vip-1", TABLE, WORKERS) == "w-c"
    assert [assigner.owner(g, TABLE, WORKERS) for g in GROUPS] == \
        [owner(g, TABLE) for g in GROUPS]
    assert assigner.failures == 0


def test_an_error_is_logged_once_per_burst_and_the_hash_decides(caplog) -> None:
    calls = []

    def broken(group: str, workers: list[AssignWorker]) -> str:
        calls.append((group, [w.hostname for w in workers]))
        raise KeyError(group)

    assigner = Assigner(broken)
    with caplog.at_level(logging.WARNING, logger="celery_fair.assign"):
        chosen = [assigner.owner(g, TABLE, WORKERS) for g in GROUPS]
        assigner.report()
    assert chosen == [owner(g, TABLE) for g in GROUPS]
    assert calls[0] == (GROUPS[0], ["w-a", "w-c"]) and len(calls) == len(GROUPS)
    lines = [r for r in caplog.records if r.name == "celery_fair.assign"]
    assert len(lines) == 2, [r.getMessage() for r in lines]
    assert "raised for group 'tenant-0'" in lines[0].getMessage() and lines[0].exc_info
    assert "failed for 50 groups" in lines[1].getMessage()
    assert assigner.failures == 0  # the burst is over


def test_a_worker_that_is_not_live_is_logged_and_the_hash_decides(caplog) -> None:
    assigner = Assigner(lambda group, workers: "w-gone")
    with caplog.at_level(logging.WARNING, logger="celery_fair.assign"):
        assert assigner.owner("tenant-1", TABLE, WORKERS) == owner("tenant-1", TABLE)
    assert "returned 'w-gone', not a live worker" in caplog.text


def test_without_workers_or_function_it_is_the_hash() -> None:
    assert Assigner(None).owner("g", TABLE, []) == owner("g", TABLE)
    assert Assigner(vip_on_c).owner("vip-2", TABLE, []) == owner("vip-2", TABLE)
    assert Assigner(None).owner("g", [], []) is None


def test_fair_assign_is_checked_then_imported_by_path() -> None:
    assert assign_ref(None) is None and assign_ref(vip_on_c) is vip_on_c
    assert load_assign("tests.test_assign:vip_on_c") is vip_on_c
    assert load_assign("tests.test_assign.vip_on_c") is vip_on_c
    for bad in ("vip_on_c", 42, "a b:c"):
        with pytest.raises(ConfigurationError, match="fair_assign"):
            assign_ref(bad)
    with pytest.raises(ConfigurationError, match="fair_assign=.*does not import"):
        load_assign("tests.test_assign:no_such_function")
    with pytest.raises(ConfigurationError, match="expected a function"):
        load_assign("tests.test_assign:TABLE")


def test_a_router_refuses_a_store_without_affinity_naming_the_queues() -> None:
    base = FairConfig(store_url="memory://", key_prefix="t", default_group="default",
                      default_concurrency=None, group_concurrency={}, group_weights={},
                      default_rate=None, group_rates={}, max_held=None, max_held_overrides={},
                      max_inflight=None, dispatch_ahead=2, interactive_reserve=1,
                      lease_seconds=30, done_ttl=0, batch_size=10, direct_push=False)
    store = NoRouting("t")
    Router(lambda: store, base, lambda: 0.0)  # no affinity asked: fine
    routed = FairConfig(**{**base.__dict__, "queue_policies": {
        "exports": PolicyChoice(affinity="hash")}})
    with pytest.raises(ConfigurationError, match="fair_affinity='hash'.*'exports'.*Redis"):
        Router(lambda: store, routed, lambda: 0.0)


def test_the_policy_column_names_affinity_and_spill() -> None:
    assert PolicyChoice(affinity="hash").describe() == "wfq, affinity hash"
    assert PolicyChoice(affinity="hash", spill_seconds=30).describe() == \
        "wfq, affinity hash spill 30s"
    assert PolicyChoice().describe() == "wfq"

