"""capacity.room: the pool of a worker consuming several fair queues is shared among them."""

from __future__ import annotations

from celery_fair.capacity import room, sharing

ONE_WORKER = {"a": {"w": 4}, "b": {"w": 4}}


def test_a_queue_of_its_own_workers_gets_their_pools_plus_ahead() -> None:
    pools = {"a": {"w1": 4, "w2": 2}, "b": {"w3": 8}}
    assert sharing("a", pools) == []
    assert room("a", pools, {}, ahead=2) == 8


def test_an_idle_queue_leaves_the_whole_shared_pool_to_the_busy_one() -> None:
    assert sharing("a", ONE_WORKER) == ["b"]
    assert room("a", ONE_WORKER, {"b": (0, 0)}, ahead=2) == 6


def test_shared_queues_together_stay_within_the_pool_plus_ahead() -> None:
    # both backlogged: whatever one holds counts against the other
    for held_by_b in range(0, 7):
        assert room("a", ONE_WORKER, {"b": (held_by_b, 5)}, ahead=2) + held_by_b <= 6


def test_a_backlogged_queue_keeps_its_part_of_the_pool_while_it_is_not_using_it() -> None:
    # b has work but nothing in flight yet: a may not take b's half of the pool
    assert room("a", ONE_WORKER, {"b": (0, 5)}, ahead=0) == 2


def test_other_queues_count_against_a_worker_in_proportion_to_its_pool() -> None:
    # b's 6 in flight run on w (pool 4) and v (pool 2): 4 of them are w's
    pools = {"a": {"w": 4}, "b": {"w": 4, "v": 2}}
    assert room("a", pools, {"b": (6, 0)}, ahead=0) == 0
    assert room("a", pools, {"b": (3, 0)}, ahead=0) == 2


def test_no_live_worker_means_no_room() -> None:
    assert room("a", {"a": {}}, {}, ahead=2) == 0
