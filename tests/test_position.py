"""``celery_fair.position`` end to end: a real worker and dispatcher, one group behind a
slow cap-1 worker; the last task's place counts down to dispatched."""

from __future__ import annotations

import time

import pytest

from celery_fair import position
from celery_fair.contrib.web import position_json


def test_a_position_counts_down_to_dispatched(make_app, worker, dispatcher) -> None:
    app = make_app(fair_default_concurrency=1)
    nap = app.tasks["proj.nap"]
    results = [nap.delay("acme", 0.5) for _ in range(5)]
    last = results[-1].id
    first = position(app, last)
    assert (first.state, first.in_group, first.group) == ("held", 5, "acme")
    seen: list[int] = []
    etas: list[float] = []
    with dispatcher(app), worker(concurrency=1):
        deadline = time.monotonic() + 30
        while (now := position(app, last)).state == "held":
            assert now.in_group is not None
            seen.append(now.in_group)
            if now.eta_seconds is not None:
                etas.append(now.eta_seconds)
            assert time.monotonic() < deadline, f"still held: {now}"
            time.sleep(0.02)
        assert now.state in ("dispatched", "not held")  # picked, queued, running, or done
        results[-1].get(timeout=30)
        assert position(app, last).state == "not held"
    assert seen == sorted(seen, reverse=True), seen  # never goes back
    # every place on the way (0.5 s per task, polled every 20 ms), down to the head
    assert seen[-1] == 1 and set(seen) == set(range(1, seen[0] + 1)), seen
    assert etas, "no wait estimate while the queue released tasks"
    assert position_json(app, last)["state"] == "not held"


def test_a_task_id_must_be_a_string(app) -> None:
    with pytest.raises(ValueError, match="task_id 42: expected a non-empty task id"):
        position(app, 42)  # type: ignore[arg-type]
