"""Liveness end to end: a real ``celery -A tests.proj fair dispatch`` process beats in a
real Redis while tasks are held; ``fair status``, ``fair check`` (real ``celery``
processes) and ``/metrics`` list it; after ``kill -9`` it drops out within the beat's TTL,
and all of them warn, naming the command that starts a dispatcher of this app.
(Flower's page: tests/test_flower.py; the store contract: test_store_contract_liveness.py.)
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from pathlib import Path
from typing import Any

from celery_fair.dispatcher import Dispatcher
from celery_fair.heartbeat import BEAT_TTL_MS, Heartbeat
from celery_fair.metrics import DispatcherMetrics
from celery_fair.store import store_for_url
from celery_fair.store.base import now_ms
from celery_fair.task import store_for
from celery_fair.testing import free_port

from .conftest import DispatcherThread, subprocess_env, wait_for
from .helpers import queue_of
from .procs import CELERY, ROOT, CeleryProcess
from .test_metrics import scrape, series

COMMAND = "celery -A tests.proj fair dispatch"  # the -A the processes below are given


def fair(redis_url: str, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CELERY, "-A", "tests.proj", "fair", *args], cwd=ROOT,
                          env=subprocess_env({}, redis_url + "/0", namespace),
                          capture_output=True, text=True, timeout=60)


def test_a_killed_dispatcher_is_reported_by_status_check_and_metrics(
        make_app: Any, redis_server: Any, namespace: str, tmp_path: Path) -> None:
    app = make_app()
    queue, store = queue_of(app), store_for(app)
    for i in range(3):  # no worker consumes the queue: they stay held
        app.tasks["proj.work"].delay("acme", f"x{i}")
    # /metrics served by a dispatcher of another queue (scraped, never run): it outlives
    # the one killed below, as a second dispatcher or Flower does
    metrics = DispatcherMetrics(Dispatcher(app, queues=["other"]), 5)
    port = metrics.serve(0, "127.0.0.1")
    proc = CeleryProcess(["fair", "dispatch"], {}, redis_server.url + "/0", namespace,
                         tmp_path / "dispatch.log")
    try:
        [beat] = wait_for(lambda: store.dispatchers(now_ms()), timeout=30,
                          what="the dispatcher's first beat")
        assert (beat.pid, beat.app, beat.every_queue) == (proc.pid, "tests.proj", True)
        assert time.time() * 1000 - 30_000 < beat.started_ms <= now_ms()

        status = fair(redis_server.url, namespace, "status")
        assert f"dispatcher {beat.host} pid {proc.pid}, last step" in status.stdout, status
        assert "WARNING" not in status.stdout
        clean = fair(redis_server.url, namespace, "check", "--json")
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert [d["id"] for d in json.loads(clean.stdout)["dispatchers"]] == [beat.id]
        assert series(scrape(port), "celery_fair_dispatchers") == {f"queue={queue}": 1}

        proc.kill_group()  # kill -9: no clean stop, the beat must lapse
        killed = time.monotonic()
        wait_for(lambda: not store.dispatchers(now_ms()), timeout=BEAT_TTL_MS / 1000 + 5,
                 interval=0.2, what="the killed dispatcher's beat to lapse")
        lapsed = time.monotonic() - killed
        print(f"the killed dispatcher's beat lapsed {lapsed:.1f}s after kill -9")
        assert lapsed <= BEAT_TTL_MS / 1000 + 1.5

        warning = (f"no live dispatcher for queue {queue} with 3 held: those tasks do not "
                   f"run until one starts; start one with `{COMMAND}`")
        status = fair(redis_server.url, namespace, "status")
        assert f"WARNING: {warning}" in " ".join(status.stdout.split()), status.stdout
        [q] = json.loads(fair(redis_server.url, namespace, "status", "--json").stdout)["queues"]
        assert (q["warning"], q["dispatchers"]) == (warning, [])
        found = fair(redis_server.url, namespace, "check", "--json")
        assert found.returncode == 1, found.stdout + found.stderr
        report = json.loads(found.stdout)
        assert report["dispatchers"] == []
        assert [(f["kind"], f["subject"], f["detail"]) for f in report["findings"]] == \
            [("no_dispatcher", queue, warning)]
        assert series(scrape(port), "celery_fair_dispatchers") == {f"queue={queue}": 0}
    finally:
        proc.stop()
        metrics.close()


def test_an_idle_dispatcher_keeps_beating_and_a_clean_stop_forgets_it(app: Any) -> None:
    store = store_for(app)
    with DispatcherThread(app) as dispatcher:
        [first] = wait_for(lambda: store.dispatchers(now_ms()), what="the first beat")
        assert first.id == dispatcher.heartbeat.id
        # nothing to do: its steps go on, and the beat shows each newer one
        later = wait_for(lambda: [b for b in store.dispatchers(now_ms())
                                  if b.last_step_ms > first.last_step_ms + 1_000],
                         timeout=10, interval=0.1, what="a later beat of the idle dispatcher")
        assert later[0].started_ms == first.started_ms
    assert store.dispatchers(now_ms()) == []  # stopped cleanly: forgotten at once


def test_a_store_error_while_beating_is_logged_not_raised(caplog: Any) -> None:
    closed = store_for_url(f"redis://127.0.0.1:{free_port()}/0", "x")  # nothing listens
    heartbeat = Heartbeat(lambda: closed, lambda: (["q"], False), "docshop")
    caplog.set_level(logging.DEBUG, logger="celery_fair.dispatcher")
    heartbeat.maybe_beat()
    heartbeat._beaten = None  # the next loop turn, a second later
    heartbeat.maybe_beat()
    failed = [r for r in caplog.records if "dispatcher heartbeat failed" in r.getMessage()]
    assert [r.levelno for r in failed] == [logging.WARNING, logging.DEBUG]  # once per outage
