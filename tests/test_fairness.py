"""Fairness end to end: real in-thread Celery workers, a real dispatcher, a real Redis.

Every assertion is about order and counts recorded by the tasks themselves (the ledger),
never about how long something took, so the tests hold on a busy machine. The tests
taking ``store_backend`` run twice: celery_fair's store on Redis, then on PostgreSQL
(the SQL store; broker, results and ledger stay on Redis). The last test reads and
edits a Redis key of the store itself (the queue set), so it is Redis's alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Callable

from celery import Celery

from celery_fair.store.keys import queues_key
from celery_fair.task import store_for

from .conftest import wait_for

#: Every test enqueues its tasks and then waits at most this long for anything.
TIMEOUT = 60


def assert_round_robin(order: Iterable[str], groups: Iterable[str]) -> None:
    """No group ever gets two ahead of another, at any point of the order."""
    counts = Counter({g: 0 for g in groups})
    for i, g in enumerate(order):
        counts[g] += 1
        spread = max(counts.values()) - min(counts.values())
        assert spread <= 1, f"after {i + 1} starts the counts are {dict(counts)}"


def started(app: Celery) -> list[dict[str, Any]]:
    return app.ledger.starts()  # type: ignore[attr-defined, no-any-return]


def labels(app: Celery) -> list[str]:
    return [s["label"] for s in started(app)]


def wait_started(app: Celery, predicate: Callable[[list[dict[str, Any]]], bool],
                 what: str) -> list[dict[str, Any]]:
    return wait_for(lambda: (lambda s: s if predicate(s) else None)(started(app)),
                    timeout=TIMEOUT, what=what)


def test_round_robin_with_one_slot(make_app, worker, dispatcher, store_backend) -> None:
    app = make_app(fair_max_inflight=1)
    work = app.tasks["proj.work"]
    groups = ["tenant-c", "tenant-a", "tenant-b"]
    results = []
    for g in groups:  # one group's whole backlog after the other: arrival is not fair
        results += [work.delay(g, f"{g}-{i}") for i in range(30)]
    with worker(concurrency=1, the_app=app), dispatcher(the_app=app):
        for r in results:
            r.get(timeout=TIMEOUT)
    starts = started(app)
    assert len(starts) == 90
    order = [s["group"] for s in starts]
    assert_round_robin(order, groups)
    assert Counter(order) == {g: 30 for g in groups}
    # within a group, its own tasks keep their order
    for g in groups:
        assert [s["label"] for s in starts if s["group"] == g] == \
            [f"{g}-{i}" for i in range(30)]
    assert app.ledger.max_all() == 1


def test_weights_share_one_slot_three_to_one(make_app, worker, dispatcher,
                                             store_backend) -> None:
    app = make_app(fair_max_inflight=1, fair_group_weights={"heavy": 3})
    work = app.tasks["proj.work"]
    results = []
    for g in ("light", "heavy"):  # light's whole backlog arrives first
        results += [work.delay(g, f"{g}-{i}") for i in range(30)]
    with worker(concurrency=1, the_app=app), dispatcher(the_app=app):
        for r in results:
            r.get(timeout=TIMEOUT)
    order = [s["group"] for s in started(app)]
    assert Counter(order) == {"heavy": 30, "light": 30}
    # While both are backlogged (heavy's 30 go in the first 40 dispatches), heavy gets 3
    # dispatches to light's 1 at every point of the order: H L H H H L H H H L ...
    assert Counter(order[:40]) == {"heavy": 30, "light": 10}, order[:40]
    for n in range(1, 41):
        head = Counter(order[:n])
        assert abs(head["heavy"] - 3 * head["light"]) <= 3, (n, order[:n])
    assert order[40:] == ["light"] * 20
    assert app.ledger.max_all() == 1


def test_group_caps_and_capacity(make_app, worker, dispatcher, store_backend) -> None:
    app = make_app(fair_default_concurrency=2, fair_group_concurrency={"solo": 1},
                   fair_max_inflight=3)
    work = app.tasks["proj.work"]
    # "big" outlasts the others, so it runs alone at the end with capacity to spare
    plan = {"big": 30, "solo": 12, "small": 6}
    results = [work.delay(g, f"{g}-{i}", 0.05) for g, n in plan.items() for i in range(n)]
    with worker(concurrency=8, the_app=app), dispatcher(the_app=app):
        assert [r.get(timeout=TIMEOUT) for r in results] == \
            [f"{g}-{i}" for g, n in plan.items() for i in range(n)]
    ledger = app.ledger
    assert ledger.runs() and Counter(s["group"] for s in ledger.starts()) == plan
    assert wait_for(lambda: ledger.ends() == sum(plan.values()), what="every task ended")
    peaks = ledger.max_running()
    # never above the caps (default 2, "solo" overridden to 1) nor the capacity (3)...
    assert peaks["big"] <= 2 and peaks["small"] <= 2 and peaks["solo"] <= 1, peaks
    assert ledger.max_all() <= 3
    # ...and the limits were reached, so they were what held the tasks back
    assert peaks["big"] == 2 and peaks["solo"] == 1, peaks
    assert ledger.max_all() == 3


def test_interactive_before_background(make_app, worker, dispatcher, store_backend) -> None:
    app = make_app(fair_max_inflight=1)
    work, preview = app.tasks["proj.work"], app.tasks["proj.preview"]
    for i in range(40):
        work.delay("bulk", f"bg-{i}", 0.05)
    with worker(concurrency=1, the_app=app), dispatcher(the_app=app):
        wait_started(app, lambda s: len(s) >= 3, "the backlog to start")
        interactive = [preview.delay("web", "i-web"), preview.delay("bulk", "i-bulk")]
        n0 = len(started(app))
        for r in interactive:
            r.get(timeout=TIMEOUT)
        wait_started(app, lambda s: s[-1]["label"].startswith("bg-"),
                     "background to resume")
    after = labels(app)[n0:]
    # Only the one background task already in flight when they were enqueued may start
    # before them; the rest of the backlog waits.
    positions = [after.index(x) if x in after else -1 for x in ("i-web", "i-bulk")]
    background_before = [x for x in after[:max(positions) + 1] if x.startswith("bg-")]
    assert len(background_before) <= 1, after
    bg_started = [x for x in labels(app) if x.startswith("bg-")]
    assert len(bg_started) < 40, "the backlog ran out before the interactive tasks came"
    assert after[-1].startswith("bg-")
    assert app.ledger.max_all() == 1


def test_interactive_reserve_lets_a_capped_group_through(make_app, worker, dispatcher,
                                                         store_backend) -> None:
    app = make_app(fair_default_concurrency=1, fair_interactive_reserve=1,
                   fair_max_inflight=4)
    work, preview = app.tasks["proj.work"], app.tasks["proj.preview"]
    with worker(concurrency=4, the_app=app), dispatcher(the_app=app):
        long = work.delay("A", "long", 6.0)
        wait_started(app, lambda s: any(x["label"] == "long" for x in s), "long to start")
        queued = work.delay("A", "bg-2", 0.0)  # A is at its cap: this one must wait
        previews = [preview.delay("A", "i-1", 0.3), preview.delay("A", "i-2", 0.3)]
        for r in previews:
            r.get(timeout=TIMEOUT)
        snapshot = labels(app)
        assert not long.ready(), "the interactive tasks should not have had to wait " \
                                 "for A's long background task"
        assert "i-1" in snapshot and "i-2" in snapshot
        assert "bg-2" not in snapshot  # the reserve is for interactive tasks only
        queued.get(timeout=TIMEOUT)
        # bg-2 waited for A's slot: by the time it finished, "long" had finished too
        # (its result may be stored a moment later: the slot is freed when the body
        # returns, so the ledger, not long.ready(), says when it ended).
        assert app.ledger.ends() == 4
    order = labels(app)
    assert order.index("bg-2") > order.index("i-2")
    # cap 1 + reserve 1: the two interactive tasks ran one after the other beside "long"
    assert app.ledger.max_running() == {"A": 2}


def test_big_backlog_does_not_delay_a_newcomer(make_app, worker, dispatcher, store_backend) -> None:
    app = make_app(fair_max_inflight=4)
    work = app.tasks["proj.work"]
    store = store_for(app)
    queue = app.conf.task_default_queue
    backlog = 2000
    for i in range(backlog):  # .delay, minus a result subscription per task nobody reads
        work.apply_async(("A", f"a-{i}", 0.02), ignore_result=True)
    with worker(concurrency=4, the_app=app), dispatcher(the_app=app):
        wait_started(app, lambda s: len(s) >= 20, "A's backlog to be running")
        first = work.delay("B", "b-0", 0.02)
        # A's tasks dispatched by now (FIFO within A: a-0 .. a-{dispatched-1}) were with
        # the workers before B had anything held; no scheduler can put B before those.
        held = {g["group"]: g["held_background"] for g in store.snapshot(queue)["groups"]}
        dispatched = backlog - held["A"]
        n0 = len(started(app))  # for failure messages
        rest = [work.delay("B", f"b-{i}", 0.02) for i in range(1, 5)]
        for r in [first, *rest]:
            r.get(timeout=TIMEOUT)
    starts = started(app)
    assert sorted(s["label"] for s in starts if s["group"] == "B") == \
        [f"b-{i}" for i in range(5)]
    first_b = next(i for i, s in enumerate(starts) if s["group"] == "B")
    last_b = max(i for i, s in enumerate(starts) if s["group"] == "B")
    # A's tasks dispatched after B was held, by start position
    later_a = [i for i, s in enumerate(starts)
               if s["group"] == "A" and int(s["label"][2:]) >= dispatched]
    # B's first task starts before 3 more of A's tasks do (expected: none, B had the
    # lower virtual start tag)...
    assert len([i for i in later_a if i < first_b]) < 3, \
        (dispatched, [s["label"] for s in starts[n0 - 5:first_b + 1]])
    # ...and B keeps its fair share while backlogged: every other dispatch, B A B A B A B
    # A B, so 4 of A's among B's 5 (a few more for start-order noise of the 4 threads)
    assert len([i for i in later_a if i < last_b]) <= 8, \
        [s["label"] for s in starts[n0:last_b + 1]]
    total_a = sum(1 for s in starts if s["group"] == "A")
    assert total_a < backlog / 4, "A's backlog should still be there; nothing was measured"


def test_a_queue_dropped_from_the_queue_set_is_served_again_after_the_next_hold(
        app, worker, dispatcher) -> None:
    """`fair:queues` may lose a member (a partial flush, a failover); a hold from a
    process that registered the queue before puts it back, and the dispatcher finds it."""
    work = app.tasks["proj.work"]
    store, queue = store_for(app), str(app.conf.task_default_queue)
    with worker(concurrency=1), dispatcher() as running:
        assert work.delay("acme", "before").get(timeout=TIMEOUT) == "before"
        store.client.srem(queues_key(store.namespace), queue)
        wait_for(lambda: queue not in running.directory.queues,  # re-read each second
                 what="the dispatcher to stop serving the queue gone from the set")
        assert work.delay("acme", "after").get(timeout=TIMEOUT) == "after"
    assert queue in store.queues()
