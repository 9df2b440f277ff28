"""The one instant a SIGKILL can still run a task twice: after its body, before its release.

A task's body and the record that it finished cannot be one atomic act: whatever marks it
done (celery-fair's release, Celery's ack) is written after the body returns, and a
process SIGKILLed in between leaves a run nobody can tell from one killed mid-body,
which must run again or be lost. celery-fair's release is the first write after the body
(``FairTask.__call__``), so that instant is one store call (DESIGN.md, "Dispatch state
machine"). These tests strike it and its neighbour deterministically (a pool process
killing itself at a kill point, tests/kill_points.py) with a real worker and Redis.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_fair.task import store_for
from celery_fair.testing import pool_processes

from .conftest import wait_for
from .helpers import settled
from .test_worker_crash import _one_process_worker

CONF: dict[str, Any] = {"fair_lease_seconds": 60, "worker_prefetch_multiplier": 1,
                        "task_acks_late": True, "task_reject_on_worker_lost": True}


@pytest.mark.parametrize(("point", "runs"), [("release", 2), ("postrun", 1)])
def test_a_pool_process_killed_after_the_body(make_app, dispatcher, redis_server, namespace,
                                              tmp_path, monkeypatch, point, runs):
    """Killed after the release landed (``postrun``: result stored, message not acked),
    the task ran once (Celery sees its SUCCESS and acks; a copy redelivered all the same
    is skipped by the 'released' tombstone, test_worker_crash.py). Killed
    after the body but before the release (``release``), nothing tells the store the
    body ended: the copy takes the dead run over and runs the task again, once, as one
    killed mid-body must (Celery's acks_late at-least-once). Never lost either way."""
    task_id = f"kp-{point}-{namespace}"
    monkeypatch.setenv("FAIR_TEST_KILL_AT", f"{task_id}:{point}")
    with _one_process_worker(make_app, CONF, redis_server, namespace,
                             tmp_path / f"{point}.log") as (app, proc, child):
        ledger, work, store = app.ledger, app.tasks["proj.work"], store_for(app)
        queue = str(app.conf.task_default_queue)
        result = work.apply_async(("acme", "once"), task_id=task_id)
        with dispatcher(app):
            wait_for(lambda: ledger.r.exists(ledger.key(f"killed:{task_id}")), timeout=60,
                     what="the pool process to reach its kill point")
            wait_for(lambda: pool_processes(proc.pid) not in ([], [child]), timeout=30,
                     what="the killed pool process replaced")
            assert result.get(timeout=60) == "once"
            wait_for(lambda: settled(app) and ledger.runs() == {"once": runs}, timeout=30,
                     what=f"{runs} run(s), every slot released")
            assert store.queue_figures(queue).skipped == 0  # no copy got as far
        assert proc.alive(), proc.output()
        assert ledger.runs() == {"once": runs}
