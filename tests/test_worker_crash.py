"""A worker that dies without a word: its slots come back through the lease, its tasks run.

And a message published twice (its dispatcher's lease ran out after the publish, so the
message was held and dispatched again) runs once: the worker skips the stale copy.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from celery import signals

from celery_fair.dispatcher import Dispatcher
from celery_fair.task import DISPATCH_HEADER, request_headers, store_for

from .conftest import wait_for
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


def _now_ms() -> int:
    return int(time.time() * 1000)


def _dispatch_states(app: Any) -> dict[str, str]:
    """State of every dispatch record of the app's fair queue: {dispatch id: state}."""
    store = store_for(app)
    prefix = store.keys(_queue(app)).prefix + ":d:"
    out = {}
    for key in store.client.scan_iter(match=prefix.replace("[", "\\[") + "*", count=1000):
        state = store.client.hget(key, "s")
        if state is not None:
            out[key.decode()[len(prefix):]] = state.decode()
    return out


def _settled(app: Any) -> bool:
    snap = store_for(app).snapshot(_queue(app))
    return snap["inflight"] == 0 and snap["delayed"] == 0 and not snap["groups"]


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
    second = None
    try:
        wait_for(lambda: store.worker_capacity(queue, _now_ms()) == 2 or not first.alive(),
                 timeout=60, what="first worker registered")
        assert first.alive(), first.output()

        labels = [f"job-{i}" for i in range(6)]
        results = [work.delay("acme" if i % 2 else "beta", label, 2.5)
                   for i, label in enumerate(labels)]
        with dispatcher(app):
            # Two long tasks run (the pool has 2 processes; capacity is 2).
            wait_for(lambda: len(ledger.starts()) >= 2, timeout=60,
                     what="two tasks running in the first worker")
            wait_for(lambda: sorted(_dispatch_states(app).values()) == ["running", "running"],
                     timeout=30, what="both dispatches marked running")
            running = set(_dispatch_states(app))
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
            # reclaimed through the lease ('lost': the broker still owns the message), or
            # released because that task finished before the kill (record gone)
            assert {states.get(did) for did in running} <= {"lost", None}, states
            assert sum(states.get(did) == "lost" for did in running) == len(killed), states
            # Nothing ran while no worker was alive.
            assert {s["label"] for s in ledger.starts()} == started

            second = CeleryProcess([*worker_args, "-n", f"second-{namespace}@%h"], CRASH_CONF,
                                   broker, namespace, tmp_path / "second.log")
            wait_for(lambda: set(ledger.runs()) == set(labels) or not second.alive(),
                     timeout=90, interval=0.1, what="every task to run")
            assert second.alive(), second.output()
            # With acks_late the broker redelivers the two killed tasks: they run again.
            wait_for(lambda: all(ledger.runs().get(k) == 2 for k in killed), timeout=60,
                     interval=0.1, what="the killed tasks to be redelivered and run")
            assert [r.get(timeout=60) for r in results] == labels
            wait_for(lambda: _settled(app), timeout=5 * LEASE, what="every slot released")
        runs = ledger.runs()
        assert runs == {label: 2 if label in killed else 1 for label in labels}
        assert reclaimed_after < 5 * LEASE
        assert second.stop() == 0, second.output()
    except BaseException:
        print(first.output())
        if second is not None:
            print(second.output())
        raise
    finally:
        first.stop()
        if second is not None:
            second.stop()


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
    t0 = _now_ms()
    (stale,) = store.pick(queue, 10, None, t0, 1000)
    assert stale.hold_id == result.id
    assert store.reclaim(queue, t0 + 999, 100) == (0, 0)  # lease not over yet
    # ... its short lease runs out: the message is held again, at the head of its group.
    assert store.reclaim(queue, t0 + 1001, 100) == (1, 0)
    snap = store.snapshot(queue)
    assert snap["inflight"] == 0
    assert [(g["group"], g["held_background"]) for g in snap["groups"]] == [("acme", 1)]

    publisher = Dispatcher(app)
    deadline = _now_ms() + 60_000

    def publish(item: Any) -> None:
        with app.producer_or_acquire() as producer:
            assert publisher._publish_one(producer, queue, item)

    def ran(did: str) -> list[str]:
        return [state for tid, state, d in postruns if tid == result.id and d == did]

    def redispatch() -> Any:
        (item,) = store.pick(queue, 10, None, _now_ms(), 60_000)
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
    wait_for(lambda: _settled(app), what="slot released")
    assert store.snapshot(queue)["inflight"] == 0


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        import os

        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.update(int(x) for x in f.read().split())
    except FileNotFoundError:
        pass
    return out


@pytest.mark.parametrize("how", ["pool-process-killed", "hard-time-limit"])
def test_task_lost_in_the_pool_releases_its_slot_at_once(make_app, dispatcher, redis_server,
                                                         namespace, tmp_path, how):
    """The worker's main process reports the task failed (a pool process killed mid-task:
    WorkerLostError; a hard time limit: TimeLimitExceeded) and that must free the slot
    then, not a whole lease later."""
    import os
    import signal

    from celery.exceptions import TimeLimitExceeded, WorkerLostError

    lease = 60  # far longer than the test waits: only the failure signal can free the slot
    conf = {"fair_lease_seconds": lease, "worker_prefetch_multiplier": 1}
    app = make_app(**conf)
    ledger, work = app.ledger, app.tasks["proj.work"]
    store, queue = store_for(app), _queue(app)
    proc = CeleryProcess(["worker", "-P", "prefork", "-c", "1", "--without-mingle",
                          "--without-gossip", "-l", "INFO", "-n", f"pool-{namespace}@%h"],
                         conf, redis_server.url + "/0", namespace, tmp_path / "pool.log")
    try:
        wait_for(lambda: store.worker_capacity(queue, _now_ms()) == 1 or not proc.alive(),
                 timeout=60, what="worker registered")
        assert proc.alive(), proc.output()
        (child,) = _children(proc.pid)
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
            wait_for(lambda: _settled(app), timeout=30, what="store emptied")
        assert proc.alive(), proc.output()
    except BaseException:
        print(proc.output())
        raise
    finally:
        proc.stop()
