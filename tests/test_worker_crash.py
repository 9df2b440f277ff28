"""A worker that dies without a word: its slots come back through the lease, its tasks run.

And a message published twice (its dispatcher's lease ran out after the publish, so the
message was held and dispatched again) runs once: the worker skips the stale copy.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from celery import signals

from celery_fair.dispatcher import Dispatcher
from celery_fair.store.redis import now_ms
from celery_fair.task import DISPATCH_HEADER, request_headers, store_for
from celery_fair.testing import pool_processes

from .conftest import wait_for
from .helpers import settled
from .procs import CeleryProcess

LEASE = 3
CRASH_CONF: dict[str, Any] = {
    "task_acks_late": True,
    "fair_lease_seconds": LEASE,
    "worker_prefetch_multiplier": 1,
    # Redis redelivers an unacked message only after the visibility timeout; sweep for
    # such messages every second instead of kombu's default of about every 100 s.
    "broker_transport_options": {"visibility_timeout": 5, "unacked_restore_interval": 1,
                                 "unacked_restore_throttle": 1},
}


def _queue(app: Any) -> str:
    return str(app.conf.task_default_queue)


def _dispatch_states(app: Any) -> dict[str, str]:
    """State of every dispatch the app's fair queue knows: {dispatch id: state}, with
    'released' for a tombstone (its id in a `done:` hash)."""
    store = store_for(app)
    keys = store.keys(_queue(app))
    prefix, done = keys.prefix + ":d:", keys.prefix + ":done:"
    out = {}
    for key in store.client.scan_iter(match=keys.prefix.replace("[", "\\[") + ":d*",
                                      count=1000):
        name = key.decode()
        if name.startswith(done):
            out.update((did.decode(), "released") for did in store.client.hkeys(key))
        elif (state := store.client.hget(key, "s")) is not None:
            out[name[len(prefix):]] = state.decode()
    return out


def test_killed_worker_slots_come_back_and_tasks_complete(make_app, dispatcher, redis_server,
                                                          namespace, tmp_path):
    app = make_app(**CRASH_CONF)
    ledger, work = app.ledger, app.tasks["proj.work"]
    store, queue = store_for(app), _queue(app)
    broker = redis_server.url + "/0"
    worker_args = ["worker", "-P", "prefork", "-c", "2", "--without-mingle",
                   "--without-gossip", "-l", "INFO"]
    first = CeleryProcess([*worker_args, "-n", f"first-{namespace}@%h"], CRASH_CONF, broker,
                          namespace, tmp_path / "first.log")
    procs = [first]
    with _shown_and_stopped(procs):
        wait_for(lambda: store.worker_capacity(queue, now_ms()) == 2 or not first.alive(),
                 timeout=60, what="first worker registered")
        assert first.alive(), first.output()

        labels = [f"job-{i}" for i in range(6)]
        results = [work.delay("acme" if i % 2 else "beta", label, 2.5)
                   for i, label in enumerate(labels)]
        with dispatcher(app):
            # Two long tasks run (the pool has 2 processes; capacity is 2).
            wait_for(lambda: len(ledger.starts()) >= 2, timeout=60,
                     what="two tasks running in the first worker")
            # (beside them: dispatches queued ahead in the broker)
            wait_for(lambda: list(_dispatch_states(app).values()).count("running") == 2,
                     timeout=30, what="both dispatches marked running")
            running = {d for d, s in _dispatch_states(app).items() if s == "running"}
            started = {s["label"] for s in ledger.starts()}

            first.kill_group()  # no signal, no release: only the lease can tell
            killed_at = time.monotonic()
            # The tasks killed mid-run (normally both; a task that got to finish before
            # the kill on a very slow machine is not one of them).
            killed = {label for label, r in zip(labels, results)
                      if label in started and r.state != "SUCCESS"}
            assert killed, "no task was killed mid-run"

            # The leases stop being renewed; the dispatcher reclaims the slots.
            wait_for(lambda: store.snapshot(queue)["inflight"] == 0, timeout=5 * LEASE,
                     what="in-flight slots of the killed worker to come back")
            reclaimed_after = time.monotonic() - killed_at
            states = _dispatch_states(app)
            # reclaimed through the lease: an acks_late run keeps its message with the
            # record, so it is held again ('superseded': the copy the broker redelivers
            # will be skipped); or released because it finished before the kill
            assert {states.get(did) for did in running} <= {"superseded", "released"}, states
            assert sum(states.get(did) == "superseded" for did in running) == len(killed), \
                states
            # Nothing ran while no worker was alive.
            assert {s["label"] for s in ledger.starts()} == started

            # Redis hands unacked messages back once older than the visibility timeout;
            # kombu before 5.4 checks when a worker starts, then only every ~100 s. Start
            # the second worker once they are old enough (any kombu then redelivers them).
            visibility = CRASH_CONF["broker_transport_options"]["visibility_timeout"]
            wait_for(lambda: _unacked_older_than(broker, visibility), timeout=30,
                     what="the killed tasks' messages to pass the visibility timeout")
            second = CeleryProcess([*worker_args, "-n", f"second-{namespace}@%h"], CRASH_CONF,
                                   broker, namespace, tmp_path / "second.log")
            procs.append(second)
            wait_for(lambda: set(ledger.runs()) == set(labels) or not second.alive(),
                     timeout=90, interval=0.1, what="every task to run")
            assert second.alive(), second.output()
            # The killed tasks run again, once: from the messages held again, while the
            # copies the broker redelivers (acks_late) are skipped.
            wait_for(lambda: all(ledger.runs().get(k) == 2 for k in killed), timeout=60,
                     interval=0.1, what="the killed tasks to run again")
            assert [r.get(timeout=60) for r in results] == labels
            wait_for(lambda: store.queue_figures(queue).skipped >= len(killed),
                     timeout=60, what="the broker's copies of the killed tasks skipped")
            wait_for(lambda: settled(app), timeout=5 * LEASE, what="every slot released")
        runs = ledger.runs()
        assert runs == {label: 2 if label in killed else 1 for label in labels}
        assert reclaimed_after < 5 * LEASE
        assert second.stop() == 0, second.output()


def test_copy_redelivered_while_the_task_runs_is_skipped(make_app, dispatcher, redis_server,
                                                         namespace, tmp_path):
    """Redis hands an unacked message out again once its visibility timeout passes, even
    while a worker still runs it (Celery's known duplicate on Redis). The copy finds its
    dispatch running under a live lease, the message kept with it (acks_late): it is
    skipped, and the task runs once."""
    copy_redelivered_while_the_task_runs(make_app, dispatcher, redis_server, namespace,
                                         tmp_path)


def copy_redelivered_while_the_task_runs(make_app, dispatcher, redis_server, namespace,
                                         tmp_path, wrap: tuple[str, ...] = ()) -> None:
    """One task runs 8 s on a worker; its message passes Redis's visibility timeout and a
    second worker (run under ``wrap``) takes the copy: it must be skipped, not run."""
    conf = {**CRASH_CONF, "fair_lease_seconds": 30,
            "broker_transport_options": {**CRASH_CONF["broker_transport_options"],
                                         "visibility_timeout": 1}}
    app = make_app(**conf)
    ledger, work, store, queue = app.ledger, app.tasks["proj.work"], store_for(app), _queue(app)
    broker = redis_server.url + "/0"
    args = ["worker", "-P", "prefork", "-c", "1", "--without-mingle", "--without-gossip",
            "-l", "INFO"]
    first = CeleryProcess([*args, "-n", f"first-{namespace}@%h"], conf, broker, namespace,
                          tmp_path / "first.log")
    procs = [first]
    with _shown_and_stopped(procs):
        wait_for(lambda: store.worker_capacity(queue, now_ms()) == 1 or not first.alive(),
                 timeout=60, what="first worker registered")
        result = work.delay("acme", "long", 8)
        with dispatcher(app):
            wait_for(lambda: ledger.runs() == {"long": 1}, timeout=60, what="the task running")
            wait_for(lambda: _unacked_older_than(broker, 1), timeout=30,
                     what="its message to pass the visibility timeout")
            # a second worker restores the 'lost' message at start and takes the copy
            procs.append(CeleryProcess([*args, "-n", f"second-{namespace}@%h"], conf, broker,
                                       namespace, tmp_path / "second.log", wrap=wrap))
            wait_for(lambda: store.queue_figures(queue).skipped == 1
                     or ledger.runs() != {"long": 1}, timeout=60,
                     what="the redelivered copy to be skipped (or run)")
            assert ledger.runs() == {"long": 1}, "the copy ran beside the live run"
            assert result.get(timeout=60) == "long"
            wait_for(lambda: settled(app), timeout=30, what="its slot released")
        assert ledger.runs() == {"long": 1}


@contextmanager
def _shown_and_stopped(procs: list[CeleryProcess]) -> Iterator[None]:
    """Print the workers' output if the test fails; stop them either way."""
    try:
        yield
    except BaseException:
        for proc in procs:
            print(proc.output())
        raise
    finally:
        for proc in procs:
            proc.stop()


def _unacked_older_than(broker_url: str, seconds: float) -> bool:
    """Every message the broker (Redis) holds as unacked was delivered over ``seconds``
    ago (kombu's ``unacked_index``: delivery tag -> delivery time)."""
    client = redis.Redis.from_url(broker_url)
    newest = client.zrevrange("unacked_index", 0, 0, withscores=True)
    return not newest or newest[0][1] < time.time() - seconds - 0.5


@pytest.fixture
def postruns() -> Any:
    """Every task_postrun seen in this process: (task id, state, dispatch id)."""
    seen: list[tuple[str, str, str | None]] = []
    lock = threading.Lock()

    def receiver(sender: Any = None, task_id: str | None = None, task: Any = None,
                 state: str | None = None, **_: Any) -> None:
        did = request_headers(task.request).get(DISPATCH_HEADER) if task is not None else None
        with lock:
            seen.append((str(task_id), str(state), did))

    signals.task_postrun.connect(receiver, weak=False)
    yield seen
    signals.task_postrun.disconnect(receiver)


@pytest.mark.parametrize("order", ["stale-first", "stale-after-run", "stale-while-held"])
def test_stale_duplicate_is_skipped(app, worker, ledger, postruns, order):
    work = app.tasks["proj.work"]
    store, queue = store_for(app), _queue(app)
    result = work.delay("acme", "dup")

    # A dispatcher picks the message and dies before confirming it ...
    t0 = now_ms()
    (stale,) = store.pick(queue, 10, None, t0, 1000)
    assert stale.hold_id == result.id
    assert store.reclaim(queue, t0 + 999, 100) == (0, 0)  # lease not over yet
    # ... its short lease runs out: the message is held again, at the head of its group.
    assert store.reclaim(queue, t0 + 1001, 100) == (1, 0)
    snap = store.snapshot(queue)
    assert snap["inflight"] == 0
    assert [(g["group"], g["held_background"]) for g in snap["groups"]] == [("acme", 1)]

    publisher = Dispatcher(app).publisher
    deadline = now_ms() + 60_000

    def publish(item: Any) -> None:
        with app.producer_or_acquire() as producer:
            assert publisher.publish_one(producer, queue, item)

    def ran(did: str) -> list[str]:
        return [state for tid, state, d in postruns if tid == result.id and d == did]

    def redispatch() -> Any:
        (item,) = store.pick(queue, 10, None, now_ms(), 60_000)
        assert item.hold_id == result.id
        assert item.dispatch_id != stale.dispatch_id
        return item

    with worker(concurrency=4):
        if order == "stale-first":
            # The dead dispatcher's copy did reach the broker, ahead of the new one.
            current = redispatch()
            publish(stale)
            publish(current)
            assert store.confirm(queue, [current.dispatch_id], deadline) == []
        elif order == "stale-after-run":
            current = redispatch()
            publish(current)
            assert store.confirm(queue, [current.dispatch_id], deadline) == []
            assert result.get(timeout=30) == "dup"
            wait_for(lambda: ran(current.dispatch_id), what="current dispatch finished")
            publish(stale)
        else:
            # The stale copy arrives while the message is still held: it is skipped and
            # the held message stays put until it is dispatched again.
            publish(stale)
            wait_for(lambda: ran(stale.dispatch_id), what="stale copy delivered")
            assert ledger.runs() == {}
            snap = store.snapshot(queue)
            assert snap["inflight"] == 0
            assert [(g["group"], g["held_background"]) for g in snap["groups"]] == \
                [("acme", 1)]
            current = redispatch()
            publish(current)
            assert store.confirm(queue, [current.dispatch_id], deadline) == []
        # confirming the stale dispatch reports it as stale and changes nothing
        assert store.confirm(queue, [stale.dispatch_id], deadline) == [stale.dispatch_id]
        wait_for(lambda: ran(current.dispatch_id) and ran(stale.dispatch_id),
                 what="both copies delivered")
        assert result.get(timeout=30) == "dup"
    assert ran(current.dispatch_id) == ["SUCCESS"]
    assert ran(stale.dispatch_id) == ["IGNORED"]
    assert ledger.runs() == {"dup": 1}
    wait_for(lambda: settled(app), what="slot released")
    assert store.snapshot(queue)["inflight"] == 0


@pytest.mark.parametrize("done_ttl", [7200, 0])
def test_copy_redelivered_after_the_task_ran_is_skipped(app, worker, ledger, postruns,
                                                        done_ttl):
    """acks_late: a worker killed after the task ended but before its ack reached the
    broker (or an ack lost with the connection) gets the same message delivered again.
    The dispatch's 'released' tombstone (fair_done_ttl) makes the worker skip it; with
    fair_done_ttl 0 the copy runs again, as without celery_fair."""
    from celery_fair.config import reset_config

    app.conf.fair_done_ttl = done_ttl
    reset_config(app)
    work = app.tasks["proj.work"]
    store, queue = store_for(app), _queue(app)
    result = work.delay("acme", "once")
    (item,) = store.pick(queue, 10, None, now_ms(), 60_000)
    publisher = Dispatcher(app).publisher

    def publish() -> None:  # the same message, dispatch id and all
        with app.producer_or_acquire() as producer:
            assert publisher.publish_one(producer, queue, item)

    def ran() -> list[str]:
        return [state for tid, state, d in postruns if tid == result.id]

    with worker(concurrency=2):
        publish()
        assert result.get(timeout=30) == "once"
        wait_for(lambda: ran() == ["SUCCESS"], what="first copy finished")
        assert settled(app)
        publish()  # what the broker redelivers
        wait_for(lambda: len(ran()) == 2, what="second copy delivered")
    skipped = int(store.client.hget(store.keys(queue).stat, "skipped") or 0)
    if done_ttl:
        assert ran() == ["SUCCESS", "IGNORED"]
        assert ledger.runs() == {"once": 1}
        assert skipped == 1
        assert _dispatch_states(app) == {item.dispatch_id: "released"}
    else:
        assert ran() == ["SUCCESS", "SUCCESS"]
        assert ledger.runs() == {"once": 2}
        assert skipped == 0
        assert _dispatch_states(app) == {}
    # the second copy took no slot and released nothing
    assert settled(app)
    assert store.snapshot(queue)["released"] == 1


@contextmanager
def _one_process_worker(make_app: Any, conf: dict[str, Any], redis_server: Any,
                        namespace: str, log: Any) -> Iterator[tuple[Any, CeleryProcess, int]]:
    """An app with ``conf`` and a registered prefork worker of one pool process: (app,
    worker, pid of its pool process); the worker's output is shown on failure."""
    app = make_app(**conf)
    store, queue = store_for(app), _queue(app)
    proc = CeleryProcess(["worker", "-P", "prefork", "-c", "1", "--without-mingle",
                          "--without-gossip", "-l", "INFO", "-n", f"pool-{namespace}@%h"],
                         conf, redis_server.url + "/0", namespace, log)
    try:
        wait_for(lambda: store.worker_capacity(queue, now_ms()) == 1 or not proc.alive(),
                 timeout=60, what="worker registered")
        assert proc.alive(), proc.output()
        (child,) = pool_processes(proc.pid)
        yield app, proc, child
    except BaseException:
        print(proc.output())
        raise
    finally:
        proc.stop()


@pytest.mark.parametrize("how", ["pool-process-killed", "hard-time-limit"])
def test_task_lost_in_the_pool_releases_its_slot_at_once(make_app, dispatcher, redis_server,
                                                         namespace, tmp_path, how):
    """The worker's main process reports the task failed (a pool process killed mid-task:
    WorkerLostError; a hard time limit: TimeLimitExceeded) and that must free the slot
    then, not a whole lease later."""
    from celery.exceptions import TimeLimitExceeded, WorkerLostError

    lease = 60  # far longer than the test waits: only the failure signal can free the slot
    conf = {"fair_lease_seconds": lease, "worker_prefetch_multiplier": 1}
    with _one_process_worker(make_app, conf, redis_server, namespace,
                             tmp_path / "pool.log") as (app, proc, child):
        ledger, work = app.ledger, app.tasks["proj.work"]
        store, queue = store_for(app), _queue(app)
        if how == "hard-time-limit":
            doomed = work.apply_async(("acme", "doomed", 120), time_limit=2)
        else:
            doomed = work.delay("acme", "doomed", 120)
        with dispatcher(app):
            wait_for(lambda: ledger.runs() == {"doomed": 1}, timeout=60, what="task started")
            assert store.snapshot(queue)["inflight"] == 1
            if how == "pool-process-killed":
                os.kill(child, signal.SIGKILL)
            with pytest.raises(WorkerLostError if how == "pool-process-killed"
                               else TimeLimitExceeded):
                doomed.get(timeout=60)
            wait_for(lambda: store.snapshot(queue)["inflight"] == 0, timeout=lease / 3,
                     what="the lost task's slot to be released")
            # The worker lives on (a new pool process) and runs the next task.
            assert work.delay("acme", "after", 0).get(timeout=60) == "after"
            wait_for(lambda: settled(app), timeout=30, what="store emptied")
        assert proc.alive(), proc.output()


def test_task_requeued_by_a_lost_pool_process_runs_again(make_app, dispatcher, redis_server,
                                                         namespace, tmp_path):
    """task_reject_on_worker_lost: a pool process killed mid-task requeues the message, and
    that copy must run (the task never ended: no tombstone blocks it), in its slot."""
    conf = {"fair_lease_seconds": 60, "worker_prefetch_multiplier": 1,
            "task_acks_late": True, "task_reject_on_worker_lost": True}
    with _one_process_worker(make_app, conf, redis_server, namespace,
                             tmp_path / "requeue.log") as (app, _, child):
        ledger, work, store = app.ledger, app.tasks["proj.work"], store_for(app)
        result = work.delay("acme", "again", 3)
        with dispatcher(app):
            wait_for(lambda: ledger.runs() == {"again": 1}, timeout=60, what="task started")
            os.kill(child, signal.SIGKILL)
            assert result.get(timeout=60) == "again"
            assert ledger.runs() == {"again": 2}
            wait_for(lambda: settled(app), timeout=30, what="slot released")
        assert int(store.client.hget(store.keys(_queue(app)).stat, "skipped") or 0) == 0
        assert list(_dispatch_states(app).values()) == ["released"]
