"""Soft caps and the interactive share end to end: a real in-thread Celery worker, a
real dispatcher, a real store (Redis, then the SQL store on PostgreSQL: ``store_backend``),
the companions set for the one fair queue by
``fair_queue_policies``. Measured by the tasks themselves (the ledger's counts of one
group running at once and the order the tasks started in), never by timing.

Soft caps: a lone group with cap 2 on a pool of 4 runs 4 at once; a second group that
arrives gets the slots as they free, before the first gets another. Hard caps (the
default) keep the lone group at 2.

Interactive share: on a pool of 5 with share 0.6, while both classes are backlogged at
most 3 interactive tasks run at once and background makes progress the whole time;
without a share interactive takes all 5.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import wait_for

TIMEOUT = 60


def running(app: Any, group: str) -> int:
    return int(app.ledger.r.hget(app.ledger.key("running"), group) or 0)


@pytest.mark.parametrize("mode", ["soft", "hard"])
def test_soft_caps_let_a_lone_group_use_the_pool_until_another_arrives(
        make_app: Any, worker: Any, dispatcher: Any, mode: str, store_backend: str) -> None:
    queue = make_app().conf.task_default_queue
    app = make_app(fair_max_inflight=4, fair_group_concurrency={"a": 2, "b": 2},
                   fair_queue_policies={queue: {"fair_cap_mode": mode}})
    work = app.tasks["proj.work"]
    # a's first four end one by one, half a second apart (a's slots free one at a time,
    # a still at or over its cap for the first two), the rest are short
    first = [work.delay("a", f"a-{i}", [1.0, 1.5, 2.0, 2.5][i] if i < 4 else 0.3)
             for i in range(8)]
    with worker(concurrency=4, the_app=app), dispatcher(the_app=app):
        wait_for(lambda: running(app, "a") == (4 if mode == "soft" else 2),
                 timeout=TIMEOUT, what="a running at its height")
        before = len(app.ledger.starts())
        late = [work.delay("b", f"b-{i}", 2.0) for i in range(4)]
        for r in first + late:
            r.get(timeout=TIMEOUT)
    ledger = app.ledger
    assert wait_for(lambda: ledger.ends() == 12, timeout=TIMEOUT, what="every task ended")
    peaks = ledger.max_running()
    labels = [s["label"] for s in ledger.starts()]
    if mode == "hard":
        assert peaks["a"] == 2, peaks  # the cap binds, alone or not
        return
    assert peaks["a"] == 4, peaks  # alone: over its cap, the whole pool
    # b arrived with a holding all 4 slots: the next two slots that freed went to b
    # b arrived with a holding all 4 slots: the next two that freed (a at 3, then at its
    # cap of 2) went to b; the third (a under its cap again) to a
    assert [label[0] for label in labels[before:before + 3]] == ["b", "b", "a"], labels
    assert ledger.max_all() <= 4


@pytest.mark.parametrize("share", [0.6, None])
def test_interactive_share_leaves_background_the_rest(
        make_app: Any, worker: Any, dispatcher: Any, share: float | None,
        store_backend: str) -> None:
    queue = make_app().conf.task_default_queue
    app = make_app(fair_max_inflight=5,
                   fair_queue_policies={queue: {"fair_interactive_share": share}})
    preview, work = app.tasks["proj.preview"], app.tasks["proj.work"]
    results = [preview.delay("ui", f"i-{i}", 0.2) for i in range(15)]
    results += [work.delay("bg", f"b-{i}", 0.2) for i in range(15)]
    with worker(concurrency=5, the_app=app), dispatcher(the_app=app):
        for r in results:
            r.get(timeout=TIMEOUT)
    ledger = app.ledger
    assert wait_for(lambda: ledger.ends() == 30, timeout=TIMEOUT, what="every task ended")
    peaks = ledger.max_running()
    labels = [s["label"] for s in ledger.starts()]
    last_interactive = max(i for i, label in enumerate(labels) if label.startswith("i-"))
    background_early = sum(label.startswith("b-") for label in labels[:last_interactive])
    if share is None:  # strict priority: interactive takes every slot, background waits
        assert peaks["ui"] >= 4, peaks  # (5 but for a start later than a task's end)
        assert background_early <= 4, labels  # at most the starts racing the last ones
        return
    assert peaks["ui"] == 3, peaks  # 0.6 of 5, reached and never more
    # background ran alongside: 2 slots of 5 while interactive was backlogged
    assert background_early >= 8, labels
    assert ledger.max_all() <= 5


def test_the_companions_per_queue_reach_the_store_and_the_status(make_app: Any) -> None:
    from celery_fair.cli_render import QUEUE_COLUMNS
    from celery_fair.config import get_config
    from celery_fair.directory import policy_of
    from celery_fair.reporting import policy_words

    app = make_app(fair_interactive_share=0.8, task_routes={"proj.x": {"queue": "exports"}},
                   fair_queue_policies={"exports": {"fair_cap_mode": "soft",
                                                    "fair_interactive_share": None}})
    config = get_config(app)
    default = app.conf.task_default_queue
    exports, other = policy_of(config, "exports"), policy_of(config, default)
    assert (exports.cap_mode, exports.interactive_share) == ("soft", None)
    assert (other.cap_mode, other.interactive_share) == ("hard", 0.8)
    assert policy_words(config) == "wfq, i≤0.8 (exports: wfq, soft-cap)"
    cell = dict(QUEUE_COLUMNS)["policy"]
    assert cell({"policy": "wfq", "cap_mode": "soft", "interactive_share": None}) \
        == "wfq, soft-cap"
    assert cell({"policy": "wfq", "charge": "runtime", "cap_mode": "soft",
                 "interactive_share": 0.8}) == "wfq, charge runtime, soft-cap, i≤0.8"
