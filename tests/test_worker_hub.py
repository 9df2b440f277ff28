"""The worker's event loop (hub) never waits on the store: releases it decides itself (a
revoked task, a message for an unknown task, a task it failed) go to a thread of their own.

A real prefork worker whose store never answers (a blackholed listener) receives revoked
and unusable messages carrying dispatches; it must go on receiving and running other
tasks, and answering pings, within a deadline far below what the releases would block.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Callable

from celery import Celery

from celery_fair.task import DISPATCH_HEADER, QUEUE_HEADER

from .blackhole import Blackhole
from .conftest import wait_for
from .procs import CeleryProcess
from .test_worker_crash import _shown_and_stopped

#: Each release against the blackhole fails after 2 s (no retry): the seven below would
#: hold a waiting hub for 14 s.
STORE_DOWN = {"fair_store_socket_timeout": 2.0, "fair_store_connect_timeout": 2.0,
              "fair_store_retries": 0, "worker_prefetch_multiplier": 8}
DEADLINE = 4.0


def _dispatch_headers(app: Celery) -> dict[str, str]:
    return {DISPATCH_HEADER: "d-" + uuid.uuid4().hex[:8],
            QUEUE_HEADER: str(app.conf.task_default_queue)}


def test_releases_against_a_store_that_never_answers_do_not_block_the_workers_hub(
        make_app: Callable[..., Celery], redis_server: Any, namespace: str,
        tmp_path: Path) -> None:
    with Blackhole() as hole:
        conf = {**STORE_DOWN, "fair_store_url": hole.url}
        app = make_app(**conf)
        worker = CeleryProcess(["worker", "-P", "prefork", "-c", "2", "--without-mingle",
                                "--without-gossip", "-l", "INFO", "-n",
                                f"hub-{namespace}@%h"], conf, redis_server.url + "/0",
                               namespace, tmp_path / "worker.log")
        with _shown_and_stopped([worker]):
            wait_for(lambda: app.control.ping(timeout=0.5), timeout=90, what="worker up")
            # a task the main process fails itself: its hard time limit kills it
            app.tasks["proj.plain_nap"].apply_async(("acme", 30), time_limit=1,
                                                    headers=_dispatch_headers(app))
            wait_for(lambda: "Hard time limit" in worker.output(50000), timeout=60,
                     what="the hard time limit")
            revoked = [uuid.uuid4().hex for _ in range(4)]
            assert app.control.revoke(revoked, reply=True, timeout=5)
            for task_id in revoked:  # revoked before it arrives: the hub drops it
                app.tasks["proj.plain_nap"].apply_async(
                    ("acme", 0), task_id=task_id, headers=_dispatch_headers(app))
            for _ in range(2):  # a task no worker knows: the hub rejects it
                app.send_task("proj.no_such_task", headers=_dispatch_headers(app))
            started = time.monotonic()
            done = app.tasks["proj.plain_nap"].apply_async(("acme", 0))
            assert done.get(timeout=60) == "slept"
            took = time.monotonic() - started
            print(f"plain task done in {took:.2f}s")
            assert took < DEADLINE, f"a plain task took {took:.1f}s behind the releases"
            assert app.control.ping(timeout=DEADLINE), "no ping reply"
            # and the releases were made, in the background: they met the outage
            wait_for(lambda: "releasing slots" in worker.output(50000), timeout=60,
                     what="the releases to meet the outage")
