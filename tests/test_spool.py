"""Failed releases outlive their process: a pool process that ends a task while the store
is down, then dies (a worker crashing on the outage takes its pool with it), leaves its
release in the spool; the copy the broker redelivers lands it before it would take the
run over, and so does every lease keeper on the host."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
from celery import Celery

from celery_fair.config import get_config
from celery_fair.dispatcher import Dispatcher
from celery_fair.errors import ConfigurationError, StoreConnectionError
from celery_fair.spool import Spool, spool_for
from celery_fair.store.base import BeginResult
from celery_fair.store.redis import Bounds, RedisStore
from celery_fair.task import DISPATCH_HEADER, QUEUE_HEADER, begin_dispatch, store_for
from celery_fair.worker import LeaseKeeper, PendingReleases

from .blackhole import Blackhole
from .conftest import wait_for

#: Begins the dispatch as a run of its own process, spools its release as if the store had
#: been down when the task ended, and exits.
DIES_HOLDING = """
import sys, time
from celery_fair.spool import spool_for
from celery_fair.store.redis import RedisStore
from celery_fair.task import new_run
url, namespace, queue, did = sys.argv[1:]
store = RedisStore.from_url(url, namespace)
run = new_run()
assert store.begin(queue, did, int((time.time() + 60) * 1000), run=run, acks_late=True) == 1
spool_for(store).add(queue, did, 3600, run)
"""


def _dead_run_with_a_spooled_release(app: Celery) -> tuple[str, str]:
    """A dispatch whose run ended, could not tell the store, and died: (queue, did)."""
    store, queue = store_for(app), str(app.conf.task_default_queue)
    app.tasks["proj.work"].delay("acme", "once")
    assert Dispatcher(app).step().dispatched == 1
    [did] = [d.decode() for d in store.client.zrange(store.keys(queue).leases, 0, -1)]
    url = get_config(app).store_url
    subprocess.run([sys.executable, "-c", DIES_HOLDING, url, store.namespace, queue, did],
                   check=True, timeout=60)
    assert store.client.hget(store.keys(queue).dispatch(did), "s") == b"running"
    return queue, did


def test_the_copy_lands_the_dead_runs_release_and_is_skipped(
        make_app: Callable[..., Celery]) -> None:
    app = make_app(fair_max_inflight=1, task_acks_late=True)
    queue, did = _dead_run_with_a_spooled_release(app)
    store = store_for(app)
    got = begin_dispatch(app, {DISPATCH_HEADER: did, QUEUE_HEADER: queue}, acks_late=True)
    assert got is BeginResult.SKIP
    assert store.dispatch_state(queue, did) == "released"
    assert store.queue_figures(queue).inflight == 0
    assert not list(spool_for(store).directory.glob("*.jsonl"))


def test_a_lease_keeper_lands_what_a_dead_process_spooled(
        make_app: Callable[..., Celery]) -> None:
    app = make_app(fair_max_inflight=1, task_acks_late=True)
    queue, did = _dead_run_with_a_spooled_release(app)
    store = store_for(app)
    LeaseKeeper(app, f"keeper-{time.time()}", [queue], 1).beat()
    assert store.dispatch_state(queue, did) == "released"
    assert store.queue_figures(queue).inflight == 0
    assert not list(spool_for(store).directory.glob("*.jsonl"))


def test_a_torn_spool_line_is_passed_over(make_app: Callable[..., Celery]) -> None:
    app = make_app(fair_max_inflight=1, task_acks_late=True)
    queue, did = _dead_run_with_a_spooled_release(app)
    spool = spool_for(store_for(app))
    [path] = spool.directory.glob("*.jsonl")
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"q": "half a li')  # the process died writing it
    assert spool.replay_dead() == 1




#: Run as pid 1 of a new PID namespace: a child spools a release and dies; the next child
#: is given the same pid (ns_last_pid), spools one of its own, clears its file as its
#: releases land, and stays alive. Prints whether the dead child's release was still on
#: disk, and how many releases replaying the dead processes' files landed.
RECYCLED_PID = """
import json, os, sys, time
from pathlib import Path
from celery_fair.spool import Spool
from celery_fair.store.redis import RedisStore
url, namespace, root = sys.argv[1:]
spool = Spool(RedisStore.from_url(url, namespace), Path(root))

def child(*actions, stay=None):
    pid = os.fork()
    if pid == 0:
        for action in actions:
            action()
        if stay:
            os.write(stay[1], b"x")  # done: now alive with the dead one's pid
            os.read(stay[2], 1)
        os._exit(0)
    return pid

dead = child(lambda: spool.add("q", "dead-did", 3600, "dead-run"))
os.waitpid(dead, 0)
# A pid comes round again after the others (pid_max of them), never in the clock tick
# its last process started in (start times count ticks): let that tick pass.
[name] = [p.name for p in spool.directory.glob("*.jsonl")]
started = int(name.split(".")[1]) if name.count(".") > 1 else 0
deadline = time.monotonic() + 5
while float(Path("/proc/uptime").read_text().split()[0]) * 100 <= started + 1:
    assert time.monotonic() < deadline
with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
    fh.write(str(dead - 1))
ready, go = os.pipe(), os.pipe()
again = child(lambda: spool.add("q", "new-did", 3600, "new-run"), spool.clear,
              stay=(None, ready[1], go[0]))
os.read(ready[0], 1)
assert again == dead, (dead, again)
kept = any("dead-did" in p.read_text() for p in spool.directory.glob("*.jsonl"))
print(json.dumps({"kept": kept, "replayed": spool.replay_dead()}))
os.write(go[1], b"x")
os.waitpid(again, 0)
"""


def test_a_process_given_a_dead_ones_pid_neither_clears_nor_hides_the_dead_ones_spool(
        make_app: Callable[..., Celery], tmp_path: Path) -> None:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to recycle a pid")
    app = make_app()
    root = tmp_path / "spool"
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                           "-c", RECYCLED_PID, get_config(app).store_url,
                           store_for(app).namespace, str(root)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # kept: the new process did not clear it; replayed: its pid is alive again, but not
    # by the process that wrote it, so the dead one's release still lands
    assert json.loads(done.stdout) == {"kept": True, "replayed": 1}


def test_a_flush_with_nothing_to_do_keeps_the_spool_of_releases_another_flush_has_in_flight(
        tmp_path: Path) -> None:
    # The store never answers: the first flush holds its release in flight for a second.
    with Blackhole() as hole:
        store = RedisStore.from_url(hole.url, "ns", Bounds(1.0, 1.0, 0))
        spool = Spool(store, tmp_path / "spool")
        pending = PendingReleases(backoff=(600, 600))  # its own retrier stays out of it
        pending.add(store, "q", "did-1", 3600, "run", spool)
        failed = threading.Event()

        def first_flush() -> None:
            with contextlib.suppress(StoreConnectionError):
                pending.flush(store)
            failed.set()

        threading.Thread(target=first_flush, daemon=True).start()
        wait_for(lambda: len(pending) == 0, timeout=10, what="the first flush to take it")
        assert pending.flush(store) == 0  # nothing left to do here...
        assert failed.wait(30)
    assert len(pending) == 1  # ...and the first flush failed: the release waits again
    assert "did-1" in spool.own_path().read_text(), "the spool lost the release"


def test_a_spool_directory_others_can_write_to_is_refused_and_never_replayed(
        make_app: Callable[..., Celery], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    # Another local user made the directory and planted a release of a running dispatch.
    app = make_app(fair_max_inflight=1, task_acks_late=True)
    queue, did = _dead_run_with_a_spooled_release(app)
    store = store_for(app)
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    spool = Spool(store, root)
    spool.directory.mkdir(mode=0o777)
    spool.directory.chmod(0o777)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    line = json.dumps({"q": queue, "d": did, "s": 3600, "r": ""}) + "\n"
    for name in (f"{dead}.jsonl", f"{dead}.0.planted.jsonl"):
        (spool.directory / name).write_text(line)
    assert spool.replay_dead() == 0
    assert store.client.hget(store.keys(queue).dispatch(did), "s") == b"running"
    assert "open to group or others" in caplog.text and str(root) in caplog.text


def test_the_default_spool_directory_is_this_users_own_with_mode_0700(
        make_app: Callable[..., Celery]) -> None:
    app = make_app(fair_max_inflight=1, task_acks_late=True)
    _dead_run_with_a_spooled_release(app)
    spool = spool_for(store_for(app))
    for directory in (spool.directory, spool.directory.parent):
        info = directory.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (os.getuid(), 0o700)
    assert str(os.getuid()) in spool.directory.parent.name


def test_a_bad_spool_dir_setting_is_refused_naming_it(make_app: Callable[..., Celery]) -> None:
    with pytest.raises(ConfigurationError, match="fair_spool_dir"):
        get_config(make_app(fair_spool_dir="relative/dir"))
