"""Revoking a held task removes it from the store and makes it REVOKED, as Celery would.

``cancel.lua`` is tested directly first (times passed in, deterministic); then
``AsyncResult.revoke()``, ``GroupResult.revoke()``, ``celery_fair.cancel`` and
``celery -A proj fair cancel`` end to end, compared with plain Celery where Celery can
do the same; then ``revoke(terminate=True)`` of a running task in a prefork worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import subprocess
import threading
from typing import Any

import pytest
import redis
from celery import chord, group
from celery.exceptions import TaskRevokedError

from celery_fair import cancel
from celery_fair.dispatcher import Dispatcher
from celery_fair.envelope import INTERACTIVE, placement_of
from celery_fair.store.redis import RedisStore, now_ms
from celery_fair.store.scripts import source
from celery_fair.task import store_for

from .conftest import subprocess_env, wait_for
from .helpers import (
    client_app,
    held,
    held_chord,
    queue_of,
    settled,
    snapshot,
    wait_capacity,
    wait_settled,
)
from .procs import CELERY, ROOT, CeleryProcess
from .store_helpers import NOW, Q, hold, pick, snapshot_groups, value

# -- cancel.lua ---------------------------------------------------------------------------


@pytest.fixture
def store(redis_client: redis.Redis, namespace: str) -> RedisStore:
    return RedisStore(redis_client, namespace)


def _ready(store: RedisStore, klass: str = "b") -> list[str]:
    return [g.decode() for g in store.client.zrange(store.keys(Q).ready(klass), 0, -1)]


def test_cancel_held_message(store):
    data = value("acme", body=b"task-1 body")
    store.hold(Q, "task-1", data, placement_of(data), 0, NOW)
    assert store.cancel(Q, ["task-1"]) == [("task-1", data)]
    assert store.snapshot(Q)["groups"] == []          # group forgotten: nothing left
    assert _ready(store) == [] and store.client.hlen(store.keys(Q).msg) == 0
    assert store.cancel(Q, ["task-1"]) == []           # gone: nothing to cancel twice
    assert pick(store, 10) == []


def test_cancel_one_of_a_group_keeps_the_rest(store):
    for hid in ("a1", "a2", "a3"):
        hold(store, "acme", hold_id=hid)
    hold(store, "beta", hold_id="b1", klass=INTERACTIVE)
    assert [hid for hid, _ in store.cancel(Q, ["a2", "b1", "unknown"])] == ["a2", "b1"]
    groups = snapshot_groups(store)
    assert set(groups) == {"acme"} and groups["acme"]["held_background"] == 2
    assert _ready(store, "i") == [] and _ready(store) == ["acme"]
    assert [p.hold_id for p in pick(store, 10)] == ["a1", "a3"]


def test_cancel_delayed_message(store):
    hold(store, "acme", hold_id="later", due=NOW + 5_000)
    hold(store, "acme", hold_id="now")
    assert [hid for hid, _ in store.cancel(Q, ["later"])] == ["later"]
    snap = store.snapshot(Q)
    assert snap["delayed"] == 0 and snapshot_groups(store)["acme"]["delayed"] == 0
    assert store.promote(Q, NOW + 10_000, 100) == (0, None)
    (now,) = pick(store, 10)
    assert now.hold_id == "now"
    assert store.release(Q, now.dispatch_id)
    # a group whose only message was delayed is forgotten when it is cancelled
    hold(store, "solo", hold_id="d1", due=NOW + 5_000)
    assert store.cancel(Q, ["d1"]) != []
    assert store.snapshot(Q)["groups"] == [] and store.snapshot(Q)["delayed"] == 0


def test_cancel_leaves_dispatched_messages_alone(store):
    hold(store, "acme", hold_id="t1")
    hold(store, "acme", hold_id="t2")
    (picked,) = pick(store, 1)
    assert store.cancel(Q, [picked.hold_id]) == []
    assert store.snapshot(Q)["inflight"] == 1
    assert [hid for hid, _ in store.cancel(Q, ["t2"])] == ["t2"]
    # the group still runs a task: it stays known, but it is not ready (nothing held)
    assert snapshot_groups(store)["acme"]["inflight"] == 1 and _ready(store) == []
    assert store.release(Q, picked.dispatch_id)
    assert store.snapshot(Q)["groups"] == []


def test_cancel_removes_copies_held_under_suffixed_ids(store):
    # The same task id held twice, two publications (hold.lua suffixes the second) ...
    assert hold(store, "acme", hold_id="dup", body=b"first") == "dup"
    second = hold(store, "acme", hold_id="dup", body=b"retried")
    assert second.startswith("dup~")
    # ... and a copy put back by reclaim while the id was held again.
    hold(store, "beta", hold_id="re")
    # (the dispatcher dies after picking every message; all come back through reclaim)
    (lost,) = [p for p in pick(store, 10, lease=1_000) if p.hold_id == "re"]
    hold(store, "beta", hold_id="re", body=b"retried")  # (the same message: held once)
    store.reclaim(Q, NOW + 2_000, 100)  # the picked copy comes back as 're~<did>'
    hold(store, "gamma", hold_id="dupe-not-a-copy")
    ids = {hid for hid, _ in store.cancel(Q, ["dup", "re"])}
    assert ids == {"dup", second, "re", f"re~{lost.dispatch_id}"}
    assert set(snapshot_groups(store)) == {"gamma"}
    assert store.snapshot(Q)["inflight"] == 0


def test_revoke_finds_copies_by_their_index_without_scanning_held_messages(store):
    hold(store, "acme", hold_id="dup")
    copy = hold(store, "acme", hold_id="dup", body=b"again")
    for i in range(50):
        hold(store, "acme", hold_id=f"other-{i}")
    scans = _calls(store, "hscan")
    assert {hid for hid, _ in store.cancel(Q, ["other-0"])} == {"other-0"}
    assert {hid for hid, _ in store.cancel(Q, ["dup"])} == {"dup", copy}
    assert _calls(store, "hscan") == scans  # O(copies), not a scan of everything held
    # a copy that leaves (dispatched) leaves the index: nothing of it is kept
    hold(store, "beta", hold_id="twice")
    hold(store, "beta", hold_id="twice", body=b"again")
    pick(store, 100)
    assert list(store.client.scan_iter(match=f"{store.keys(Q).prefix}:copies:*")) == []


def _calls(store: RedisStore, command: str) -> int:
    return int(store.client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_cancel_resent_after_a_lost_reply_still_returns_the_messages(store):
    """redis-py resends a call whose reply a dropped connection lost: the resend (the
    same call again) must still hand back what the first call removed, copies included,
    or the caller never marks those tasks REVOKED and the messages are gone."""
    data = value("acme", body=b"task-1 body")
    store.hold(Q, "task-1", data, placement_of(data), 0, NOW)
    copy = hold(store, "acme", hold_id="task-1", body=b"a second publication")
    hold(store, "acme", hold_id="other")
    first = store.cancel(Q, ["task-1"], token="call-1")  # its reply is lost on the way back
    assert {hid for hid, _ in first} == {"task-1", copy}
    assert sorted(store.cancel(Q, ["task-1"], token="call-1")) == sorted(first)  # resent
    assert store.cancel(Q, ["task-1"]) == []  # a new call: gone, nothing to cancel twice
    assert [p.hold_id for p in pick(store, 10)] == ["other"]  # removed once, nothing else


class ReplyDropper:
    """A TCP proxy to Redis that, once armed, passes on the next command carrying
    ``marker`` and then closes the client's connection instead of passing the reply back:
    the reply is lost to a dropped connection, after Redis ran the command."""

    def __init__(self, upstream_port: int, marker: bytes) -> None:
        self.upstream, self.marker = upstream_port, marker
        self.armed, self.dropped = threading.Event(), threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            drop = threading.Event()  # the next reply on this connection is lost
            threading.Thread(target=self._pump, args=(client, upstream, drop, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, drop, False),
                             daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, drop: threading.Event,
              requests: bool) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if requests and self.armed.is_set() and self.marker in data:
                    self.armed.clear()
                    drop.set()
                elif not requests and drop.is_set():
                    self.dropped.set()
                    break
                dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()


def test_revoke_after_a_lost_cancel_reply_marks_the_held_task_revoked(app, redis_server):
    work = app.tasks["proj.work"]
    result = work.apply_async(("acme", "x"))
    assert held(app) == {"acme": 1}
    # This client reaches the store through a proxy that loses the cancel's first reply,
    # and its redis-py retries (the store's bounded retry, fair_store_retries): it resends
    # the call, whose answer must still carry the message, or the task is never marked
    # REVOKED.
    proxy = ReplyDropper(redis_server.port, hashlib.sha1(source("cancel").encode()).hexdigest()
                         .encode())
    try:
        client = client_app(app, fair_store_url=proxy.url + "/0")
        assert not cancel(client, "not-held")  # the script is loaded: the next call runs it
        proxy.armed.set()
        assert cancel(client, result.id)
        assert proxy.dropped.is_set()  # the first reply was lost indeed
    finally:
        proxy.close()
    assert result.state == "REVOKED"
    assert settled(app)


# -- revoke() of held tasks, compared with plain Celery -----------------------------------


#: Long enough for a revoke broadcast to reach plain Celery's worker before the task is
#: due (the worker keeps the ETA message and skips it when due); the store holds it.
COUNTDOWN = 3


def _revoke_pending(app: Any, worker: Any) -> Any:
    """Publish two tasks with a countdown, revoke both; return what is seen."""
    work = app.tasks["proj.work"]
    with worker(the_app=app, concurrency=2):
        first = work.apply_async(("acme", "revoked-1"), countdown=COUNTDOWN)
        second = work.apply_async(("acme", "revoked-2"), countdown=COUNTDOWN)
        first.revoke()
        app.control.revoke([second.id])
        wait_for(lambda: first.state == second.state == "REVOKED", what="both revoked")
        with pytest.raises(TaskRevokedError):
            first.get(timeout=5)
        # the worker still runs everything else
        assert work.delay("acme", "after").get(timeout=30) == "after"
    return [(r.state, repr(r.result)) for r in (first, second)], app.ledger.runs()


def test_revoke_held_task_matches_plain_celery(make_app, worker, dispatcher, broker):
    plain = _revoke_pending(make_app(fair=False), worker)
    app = make_app()
    app.ledger.r.delete(app.ledger.key("runs"))
    work = app.tasks["proj.work"]
    held_now = work.apply_async(("acme", "x"))
    held_later = work.apply_async(("acme", "y"), countdown=60)
    assert snapshot(app)["delayed"] == 1 and held(app) == {"acme": 1}
    # Held: revoke() removes them at once, no worker needed.
    held_now.revoke()
    held_later.revoke()
    assert (held_now.state, held_later.state) == ("REVOKED", "REVOKED")
    assert settled(app)
    with dispatcher(app):
        fair = _revoke_pending(app, worker)
    assert fair == plain
    assert fair[1] == {"after": 1}
    wait_settled(app)


def _revoke_group_and_chord_member(app: Any, worker: Any) -> Any:
    add, tsum, work = (app.tasks[n] for n in ("proj.add", "proj.tsum", "proj.work"))
    with worker(the_app=app, concurrency=2):
        members = group(add.s(i, i) for i in range(3)).apply_async(countdown=COUNTDOWN)
        members.revoke()
        body = tsum.s().on_error(work.si("acme", "errback"))
        result = chord([add.s(1, 1), add.s(2, 2).set(countdown=COUNTDOWN)], body
                       ).apply_async()
        result.parent.results[1].revoke()
        wait_for(lambda: all(r.state == "REVOKED" for r in members.results) and
                 result.ready(), what="group revoked and chord done")
        wait_for(lambda: app.ledger.runs(), what="the chord's errback ran")
        return ([r.state for r in members.results], result.state,
                type(result.result).__name__, [r.state for r in result.parent.results],
                app.ledger.runs())


def test_revoke_group_and_chord_member_match_plain_celery(make_app, worker, dispatcher,
                                                           broker):
    plain = _revoke_group_and_chord_member(make_app(fair=False), worker)
    app = make_app()
    app.ledger.r.delete(app.ledger.key("runs"))
    with dispatcher(app):
        fair = _revoke_group_and_chord_member(app, worker)
    assert fair == plain
    assert plain[:4] == (["REVOKED"] * 3, "FAILURE", "ChordError", ["SUCCESS", "REVOKED"])
    wait_settled(app)


def test_revoked_last_chord_member_while_held(make_app, worker, dispatcher, broker):
    app = make_app()
    result, errback = held_chord(app)
    first, last = result.parent.results
    assert held(app) == {"acme": 2}
    with worker(the_app=app, concurrency=2):
        wait_capacity(app)
        assert Dispatcher(app, batch_size=1).step().dispatched == 1  # the first member
        assert first.get(timeout=30) == 2
        # The last part is revoked while held: the chord completes here, in this process,
        # as it would have in a worker; the body fails and its errback is held in the
        # group of the part that completed the chord.
        last.revoke()
        assert last.state == "REVOKED"
        # (the worker thread may count the first part just after first.get() returned: then
        # it is the one that completes the chord, a moment later)
        wait_for(lambda: result.state != "PENDING", timeout=30, what="the chord to complete")
        assert (result.state, type(result.result).__name__) == ("FAILURE", "ChordError")
        assert held(app) == {"acme": 1}
        with dispatcher(app):
            # Polled, not get(): on Celery 5.3 another AsyncResult of the errback's id (the
            # group that applied it), collected by the garbage collector while get()
            # waits, unsubscribes get()'s pub/sub channel (celery#4925, fixed in a later
            # Celery): get() then missed a result stored as SUCCESS (2 in 40 runs, amqp leg)
            wait_for(lambda: app.AsyncResult(errback.id).ready(), timeout=30,
                     what="the errback's result")
            assert app.AsyncResult(errback.id).result == "acme"
    wait_settled(app)


# -- celery_fair.cancel and the CLI ------------------------------------------------------


def test_cancel_api(app, worker, dispatcher):
    work = app.tasks["proj.work"]
    result = work.delay("acme", "cancelled")
    assert cancel(app, result.id) is True
    assert result.state == "REVOKED" and settled(app)
    assert cancel(app, result.id) is False          # no longer held
    assert cancel(app, "no-such-task") is False
    with worker(concurrency=1), dispatcher():
        done = work.delay("acme", "ran")
        assert done.get(timeout=30) == "ran"
        assert cancel(app, done.id) is False        # dispatched and finished: not held
    assert app.ledger.runs() == {"ran": 1}


def test_cli_cancel(app, redis_server, namespace):
    work = app.tasks["proj.work"]
    result = work.delay("acme", "x")
    env = subprocess_env({}, redis_server.url + "/0", namespace)

    def fair_cancel(*ids: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CELERY, "-A", "tests.proj", "fair", "cancel", *ids], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=60)

    done = fair_cancel(result.id)
    assert done.returncode == 0, done.stderr
    assert f"cancelled {result.id} (queue {queue_of(app)}, group acme)" in done.stdout
    assert result.state == "REVOKED" and settled(app)
    again = fair_cancel(result.id)
    assert again.returncode == 1
    assert f"not held by celery_fair: {result.id}" in again.stderr
    assert "control revoke" in again.stderr


# -- revoke(terminate=True) of a running task --------------------------------------------


def test_terminate_running_task_frees_its_slot(make_app, dispatcher, broker, redis_server,
                                               namespace, tmp_path):
    conf = {"task_track_started": True}
    app = make_app(**conf)
    broker_url = app.conf.broker_url
    store = redis_server.url + "/0"
    proc = CeleryProcess(["worker", "-P", "prefork", "-c", "2", "--without-mingle",
                          "--without-gossip", "-l", "INFO", "-n", f"t-{namespace}@%h"],
                         conf, broker_url, namespace, tmp_path / "worker.log",
                         store=None if broker == "redis" else store)
    try:
        wait_for(lambda: store_for(app).worker_capacity(queue_of(app), now_ms()) or
                 not proc.alive(), timeout=60, what="worker registered")
        assert proc.alive(), proc.output()
        with dispatcher(app):
            fair = app.tasks["proj.nap"].delay("acme", 60)
            plain = app.tasks["proj.plain_nap"].delay("acme", 60)
            wait_for(lambda: fair.state == plain.state == "STARTED", timeout=60,
                     what="both tasks running")
            assert snapshot(app)["inflight"] == 1
            fair.revoke(terminate=True)
            plain.revoke(terminate=True)
            wait_for(lambda: fair.state == plain.state == "REVOKED", timeout=30,
                     what="both tasks terminated")
            # task_revoked in the worker released the fair task's slot
            wait_for(lambda: settled(app), timeout=30, what="slot freed")
            assert repr(fair.result) == repr(plain.result)
            assert app.tasks["proj.nap"].delay("acme", 0).get(timeout=30) == "slept"
    except BaseException:
        print(proc.output())
        raise
    finally:
        proc.stop()
