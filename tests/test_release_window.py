"""The one instant a SIGKILL can still run a task twice: after its body, before it returns.

A task's body and the record that it finished cannot be one atomic act: whatever marks it
done (celery-fair's release, Celery's ack) is written after the body returns, and a
process SIGKILLed in between leaves a run nobody can tell from one killed mid-body,
which must run again or be lost. celery-fair's first act after the body
(``FairTask.__call__``) is to write its release ahead to the process's spool file (one
local append), then to send it to the store: a kill while the store call is on its way
leaves the spooled line, which the host's lease keepers (or the copy about to take the
dead run over) land first, so the task does not run again. These tests strike those
instants deterministically with a real worker and Redis: a pool process killing itself
at a kill point (tests/kill_points.py), and a release made to hang (tests/proj.py,
``test_hang_done_release``) while the whole worker is SIGKILLed: the CI failure, a
worker killed 0.8 ms after a task's end, the task run again by its lease 13 s later.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from celery_fair.store.redis import now_ms
from celery_fair.task import store_for
from celery_fair.testing import pool_processes

from .conftest import wait_for
from .helpers import settled
from .procs import CeleryProcess
from .test_worker_crash import (
    CRASH_CONF,
    LEASE,
    _dispatch_states,
    _one_process_worker,
    _queue,
    _shown_and_stopped,
)

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


def test_a_pool_process_killed_while_its_release_is_on_its_way(
        make_app, dispatcher, redis_server, namespace, tmp_path, monkeypatch):
    """Killed with the release written ahead and its store call under way (``store``):
    the copy Celery requeues finds the run's process gone and lands its spooled release
    before taking the run over, so it is skipped: the task ran once (before the
    write-ahead it ran twice, as at ``release``). Its result was never stored (the
    release comes before Celery stores it), as for a kill just after a release landed."""
    task_id = f"kp-store-{namespace}"
    monkeypatch.setenv("FAIR_TEST_KILL_AT", f"{task_id}:store")
    with _one_process_worker(make_app, CONF, redis_server, namespace,
                             tmp_path / "store.log") as (app, proc, child):
        ledger, work, store = app.ledger, app.tasks["proj.work"], store_for(app)
        queue = str(app.conf.task_default_queue)
        work.apply_async(("acme", "once"), task_id=task_id)
        with dispatcher(app):
            wait_for(lambda: ledger.r.exists(ledger.key(f"killed:{task_id}")), timeout=60,
                     what="the pool process to reach its kill point")
            wait_for(lambda: store.queue_figures(queue).skipped == 1
                     or ledger.runs() != {"once": 1}, timeout=60,
                     what="the requeued copy to be skipped (or to run)")
            wait_for(lambda: settled(app), timeout=30, what="every slot released")
        assert proc.alive(), proc.output()
        assert ledger.runs() == {"once": 1}, "a task whose body returned ran again"


#: A lease long enough that the live worker's lease keeper (a beat each third of it) lands
#: the dead process's spool before the lease can run out: at least two thirds after the
#: kill (renewed up to a third before it), against a beat within a third.
LEASE_HERE = 2 * LEASE
LEASE_CONF = {**CRASH_CONF, "fair_lease_seconds": LEASE_HERE}


def test_a_task_killed_between_its_end_and_its_release_is_not_run_again(
        make_app, dispatcher, redis_server, namespace, tmp_path):
    """The body returned, so the task must not run again: the release is written ahead
    to the process's spool before the store call, and the lease keeper of another worker
    on the host lands it before the lease runs out; the broker's copy is then skipped as
    done. Without the write-ahead the lease ran the task again."""
    app = make_app(**LEASE_CONF)
    ledger, work = app.ledger, app.tasks["proj.work"]
    store, queue = store_for(app), _queue(app)
    broker = redis_server.url + "/0"
    args = ["worker", "-P", "prefork", "-c", "1", "--without-mingle", "--without-gossip",
            "-l", "INFO"]
    first = CeleryProcess([*args, "-n", f"first-{namespace}@%h"],
                          {**LEASE_CONF, "test_hang_done_release": True}, broker, namespace,
                          tmp_path / "first.log")
    procs = [first]
    with _shown_and_stopped(procs):
        wait_for(lambda: store.worker_capacity(queue, now_ms()) == 1 or not first.alive(),
                 timeout=60, what="first worker registered")
        assert first.alive(), first.output()
        work.delay("acme", "once", 0)
        with dispatcher(app):
            hung = wait_for(lambda: ledger.r.lrange(ledger.key("hung"), 0, -1), timeout=60,
                            what="the task's body to return and its release to hang")
            did = hung[0].decode()
            assert ledger.runs() == {"once": 1}
            assert _dispatch_states(app).get(did) == "running"
            # another worker of this host, as in the campaign (its lease keeper replays)
            procs.append(CeleryProcess([*args, "-n", f"second-{namespace}@%h"], LEASE_CONF,
                                       broker, namespace, tmp_path / "second.log"))
            wait_for(lambda: store.worker_capacity(queue, now_ms()) == 2, timeout=60,
                     what="second worker registered")
            first.kill_group()  # between the body's end and the release reaching the store
            killed_at = time.monotonic()
            # The broker redelivers the unacked message after its visibility timeout (5 s);
            # the lease (6 s) would have brought the dispatch back by the time it is
            # renewed no more: wait both out.
            wait_for(lambda: store.queue_figures(queue).skipped >= 1
                     or ledger.runs() != {"once": 1}, timeout=60,
                     what="the broker's copy to be skipped (or the task to run again)")
            wait_for(lambda: time.monotonic() - killed_at > LEASE_HERE + 1,
                     timeout=LEASE_HERE + 2, what="the lease to have run out")
            wait_for(lambda: settled(app), timeout=10 * LEASE_HERE, what="every slot released")
            assert ledger.runs() == {"once": 1}, "a task whose body returned ran again"
            assert _dispatch_states(app).get(did) == "released"
