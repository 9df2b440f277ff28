"""Smallest first with aging end to end (``fair_policy = "smallest"``,
``fair_aging_seconds``): a real in-thread Celery worker, a real dispatcher, a real store
(Redis, and the SQL store on PostgreSQL: ``store_backend``), the policy chosen for the
one fair queue by ``fair_queue_policies``, one slot
(``fair_max_inflight`` 1) so the order the tasks start in, measured by the tasks
themselves (the ledger), is the order they were picked in.

What it promises: inside a group the held task with the smallest declared cost goes
first; a task of cost c held at t is never passed by a task held after t + c·A (A the
aging), so under a steady stream of small tasks a big one still starts, after being
passed by at most the small tasks held before its bound.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from celery_fair.cli_render import policy_cell
from celery_fair.config import get_config
from celery_fair.directory import policy_of
from celery_fair.summary import queue_status
from celery_fair.task import store_for


def smallest_app(make_app: Any, aging: float) -> Any:
    queue = make_app().conf.task_default_queue
    return make_app(fair_max_inflight=1, fair_queue_policies={
        queue: {"fair_policy": "smallest", "fair_aging_seconds": aging}})


def configured(app: Any) -> None:
    """Configure the queue as a dispatcher does at its start: tasks held before that keep
    the order they were held in under the previous policy (wfq, the default)."""
    queue = app.conf.task_default_queue
    store_for(app).configure(queue, policy_of(get_config(app), queue))


def test_the_smallest_declared_cost_starts_first(make_app: Any, worker: Any, dispatcher: Any,
                                                 store_backend: str) -> None:
    app = smallest_app(make_app, aging=1.0)
    configured(app)
    work = app.tasks["proj.work"]
    costs = [5, 1, 3, 2, 4]
    results = [work.apply_async(("a", f"c{c}", 0.01), fair_cost=c) for c in costs]
    with worker(concurrency=1, the_app=app), dispatcher(the_app=app):
        for r in results:
            r.get(timeout=60)
    assert [s["label"] for s in app.ledger.starts()] == ["c1", "c2", "c3", "c4", "c5"]


def test_a_big_task_is_passed_only_by_tasks_held_before_its_bound(
        make_app: Any, worker: Any, dispatcher: Any, store_backend: str) -> None:
    """A: 0.1 s. A big task (cost 10: c·A = 1 s) among small ones (cost 1, 0.1 s ahead),
    published every 40 ms for 3 s on one slot of 60 ms tasks: the group stays
    backlogged, so without aging the big one would wait for the stream to end."""
    aging, big_cost, run_s = 0.1, 10, 0.06
    app = smallest_app(make_app, aging)
    configured(app)  # else what is held before the dispatcher's start stays in FIFO order
    work = app.tasks["proj.work"]
    published: dict[str, float] = {}
    results = []
    with worker(concurrency=1, the_app=app), dispatcher(the_app=app):
        start = time.time()
        i = 0
        while time.time() - start < 3.0:
            label = f"s{i}"
            if i == 10:
                label = "big"
            published[label] = time.time()
            results.append(work.apply_async(("a", label, run_s),
                                            fair_cost=big_cost if label == "big" else 1))
            i += 1
            time.sleep(0.04)
        for r in results:
            r.get(timeout=60)
    order = [s["label"] for s in app.ledger.starts()]
    bound = published["big"] + big_cost * aging
    ahead = order[:order.index("big")]
    # passed only by tasks published before its bound (a publication reaches the store a
    # few ms after its time here: 0.05 s of slack, under the 40 ms between two)
    late = [label for label in ahead if published[label] > bound + 0.05]
    assert not late, (late, order)
    # ... while smaller ones held after it did pass it (FIFO would have run it 11th)
    assert sum(published[label] > published["big"] for label in ahead) >= 5, order
    # ... and not starved: tasks published after its bound start after it
    after = [label for label in order[order.index("big"):] if published[label] > bound]
    assert len(after) >= 5, order


def test_fair_status_and_the_dispatcher_show_smallest_with_its_aging(make_app: Any) -> None:
    app = smallest_app(make_app, aging=2.5)
    config = get_config(app)
    queue = app.conf.task_default_queue
    assert config.policy_for(queue).describe() == "smallest, aging 2.5s"
    status = queue_status(store_for(app), config, queue, 5)
    assert policy_cell(status) == "smallest, aging 2.5s"


def test_a_bad_aging_is_refused_naming_the_setting(make_app: Any) -> None:
    from celery_fair.errors import ConfigurationError

    app = make_app(fair_policy="smallest", fair_aging_seconds=-1)
    with pytest.raises(ConfigurationError, match="fair_aging_seconds"):
        get_config(app)
    queue = app.conf.task_default_queue
    app = make_app(fair_queue_policies={queue: {"fair_aging_seconds": "soon"}})
    with pytest.raises(ConfigurationError, match=r"fair_queue_policies.*fair_aging_seconds"):
        get_config(app)
