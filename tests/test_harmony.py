"""Harmony end to end: a real in-thread Celery worker, a real dispatcher, a real store
(Redis, and the SQL store on PostgreSQL: ``store_backend``), the policy chosen for the
one fair queue by ``fair_queue_policies``.

What Harmony promises: the group with the fewest tasks in flight goes first. With two
backlogged groups on 4 slots, one of long tasks and one of short ones, the long tasks
never hold more than half the slots while the short ones wait; under wfq (which shares
dispatches, not slots) they pile up. Measured by the tasks themselves (the ledger's
highest count of one group running at once), never by timing.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from celery_fair.config import get_config
from celery_fair.directory import policy_of
from celery_fair.reporting import policy_words

from .helpers import two_groups_backlogged


@pytest.mark.parametrize("policy", ["harmony", "wfq"])
def test_harmony_keeps_long_tasks_to_their_share_of_slots(
        make_app: Any, worker: Any, dispatcher: Any, policy: str,
        caplog: pytest.LogCaptureFixture, store_backend: str) -> None:
    caplog.set_level(logging.INFO, logger="celery_fair.dispatcher")
    app = two_groups_backlogged(make_app, worker, dispatcher,
                                {"fair_policy": policy}, (6, 0.3), (120, 0.02))
    queue = app.conf.task_default_queue
    ledger = app.ledger
    labels = [s["label"] for s in ledger.starts()]
    last_slow = max(i for i, label in enumerate(labels) if label.startswith("slow"))
    # the short tasks were still waiting when the last long one started: both groups were
    # backlogged the whole time the long ones were dispatched
    assert sum(label.startswith("quick") for label in labels[last_slow:]) >= 8, labels
    peaks = ledger.max_running()
    if policy == "harmony":
        assert peaks["slow"] == 2, peaks  # half the slots, never more, and reached
    else:
        assert peaks["slow"] >= 3, peaks  # the contrast: wfq lets them pile up
    assert ledger.max_all() <= 4
    start = next(m for m in caplog.messages if "dispatcher started" in m)
    assert f"policy wfq ({queue}: {policy})" in start, start


def test_a_queues_entry_is_laid_over_the_app_wide_policy(make_app: Any) -> None:
    app = make_app(fair_policy="harmony", task_routes={"proj.x": {"queue": "exports"}},
                   fair_queue_policies={"exports": {"fair_policy": "wfq"}})
    config = get_config(app)
    default = app.conf.task_default_queue
    assert (config.policy_for("exports").name, config.policy_for(default).name) == \
        ("wfq", "harmony")
    # what a dispatcher configures each queue with
    assert (policy_of(config, "exports").name, policy_of(config, default).name) == \
        ("wfq", "harmony")
    assert policy_words(config) == "harmony (exports: wfq)"
