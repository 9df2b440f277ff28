"""What the dispatcher and the workers log: the start lines, the periodic report, the
DEBUG line of each task event, and their timestamps in UTC.

One real worker and one real dispatcher (``celery -A tests.proj ...`` subprocesses, run
with TZ set to India's zone, five and a half hours from UTC) serve the whole module, with
broker and store on a Redis user with a password, so every line that names the store must
mask it. One task runs to its end (its hold, dispatch and release lines), then five slow
ones fill the worker's one slot and the two messages ahead and leave two held (the report).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery, signals

from celery_fair import logtime
from celery_fair.config import FairConfig, reset_config
from celery_fair.dispatcher import Dispatcher
from celery_fair.errors import ConfigurationError
from celery_fair.headers import DISPATCH_HEADER, GROUP_HEADER, QUEUE_HEADER
from celery_fair.lifecycle import begin_dispatch, release_dispatch
from celery_fair.logtime import log_in_utc
from celery_fair.store.base import BeginResult
from celery_fair.testing import RedisServer

from .conftest import wait_for
from .procs import CeleryProcess
from .proj import create_app

SECRET = "rep0rt-pw"
ZONE = "Asia/Kolkata"  # UTC+05:30: a stamp in local time would be hours off
CONF = {"fair_report_interval": 0.2}


class Records(logging.Handler):
    """The records a logger of this process writes (the hold lines are the publisher's)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Run:
    app: Celery
    worker: CeleryProcess
    dispatcher: CeleryProcess
    quick_id: str
    held: Records
    started: float
    store: str  # the store's URL as the logs must show it
    report: str = ""
    lines: dict[str, str] = field(default_factory=dict)


def _start(args: list[str], url: str, namespace: str, log: Path) -> CeleryProcess:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TZ", ZONE)
        return CeleryProcess(args, CONF, url, namespace, log)


def _line(proc: CeleryProcess, pattern: str) -> str | None:
    text = proc.log_path.read_bytes().decode(errors="replace")
    found = re.search(f"^.*{pattern}.*$", text, re.M)
    return found.group(0) if found else None


@pytest.fixture(scope="module")
def run(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    namespace = "t" + uuid.uuid4().hex[:10]
    user = f"fair-{namespace}"
    admin = redis.Redis(port=redis_server.port)
    admin.acl_setuser(user, enabled=True, passwords=[f"+{SECRET}"], keys=["*"],
                      channels=["*"], commands=["+@all"])
    url = f"redis://{user}:{SECRET}@127.0.0.1:{redis_server.port}/0"
    app = create_app(url, namespace, "q-" + namespace, **CONF)
    reset_config(app)
    logs = tmp_path_factory.mktemp("reporting")
    held, task_log = Records(), logging.getLogger("celery_fair.task")
    task_log.addHandler(held)
    level, started = task_log.level, time.time()
    task_log.setLevel(logging.DEBUG)
    worker = _start(["worker", "-P", "threads", "-c", "1", "-Q", "q-" + namespace,
                     "-n", f"{namespace}@%h", "--loglevel", "DEBUG", "--without-mingle",
                     "--without-gossip", "--without-heartbeat"], url, namespace,
                    logs / "worker.log")
    dispatcher = None
    try:
        wait_for(lambda: _line(worker, "celery-fair attached"), timeout=30,
                 what="the worker's start line")
        quick = app.tasks["proj.work"].delay("quick", "q1")  # held: no dispatcher yet
        dispatcher = _start(["fair", "dispatch", "--loglevel", "DEBUG"], url, namespace,
                            logs / "dispatcher.log")
        assert quick.get(timeout=30) == "q1"
        for i in range(5):  # one running, four held (no dispatch-ahead: see below)
            app.tasks["proj.work"].delay("slow", f"s{i}", 60)
        yield Run(app, worker, dispatcher, quick.id, held, started,
                  f"redis://{user}:**@127.0.0.1:{redis_server.port}/0")
    except BaseException:
        print(worker.output(), dispatcher.output() if dispatcher else "")
        raise
    finally:
        task_log.removeHandler(held)
        task_log.setLevel(level)
        if dispatcher is not None:
            dispatcher.stop()
        worker.kill_group()  # its task sleeps a minute
        worker.stop()
        admin.acl_deluser(user)
        admin.close()


def _stamp(line: str) -> datetime:
    """The time at the head of a log line: ``[2026-11-26T05:36:54.123Z: ...``."""
    found = re.match(r"\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z: ", line)
    assert found, f"no UTC ISO 8601 timestamp in {line!r}"
    return datetime.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=timezone.utc)


def test_dispatcher_start_line_names_the_masked_store_queues_policy_and_capacity(
        run: Run) -> None:
    line = wait_for(lambda: _line(run.dispatcher, "celery_fair dispatcher started"),
                    timeout=20, what="the dispatcher's start line")
    queue = run.app.conf.task_default_queue
    assert f"store {run.store} (namespace '{run.app.conf.fair_key_prefix}')" in line, line
    assert f"queues all fair queues (now: {queue})" in line, line
    assert "policy wfq" in line, line
    assert (f"capacity auto, the live workers' pools ({queue}: 1 live worker, 1 slot) "
            "+ 0 ahead where releases refill, else 2 (fair_dispatch_ahead auto)") in line, line
    assert SECRET not in run.dispatcher.output(tail=10**7)


def test_dispatcher_reports_held_and_in_flight_of_each_busy_queue(run: Run) -> None:
    queue = run.app.conf.task_default_queue
    # Five slow tasks on a worker of one slot (a Redis broker: releases refill, so no
    # dispatch-ahead): 1 in flight, 4 held, and the oldest held one, of group slow, waits
    # ever longer.
    line = wait_for(lambda: _line(run.dispatcher, f"fair report queue={queue} "
                                  r"dispatched=\S+ held=4 delayed=0 in_flight=1/1 ahead=0 "
                                  r"oldest_wait=\d+\.\d\ds top_group=slow top_wait="),
                    timeout=20, what="a report line with 4 held and 1 in flight")
    assert "INFO/MainProcess]" in line  # the worker's log format (app.log.setup)
    # The interval is 0.2 s: the report comes again and again while there is work.
    wait_for(lambda: len(re.findall(f"fair report queue={queue} ", run.dispatcher.output(
        tail=10**7))) >= 5, timeout=10, what="reports every 0.2 s")


def test_debug_lines_follow_one_task_through_hold_dispatch_and_release(run: Run) -> None:
    queue, task = run.app.conf.task_default_queue, run.quick_id
    [hold] = [r.getMessage() for r in run.held.records
              if r.getMessage().startswith(f"fair hold task={task} ")]
    assert hold.startswith(f"fair hold task={task} group=quick queue={queue} class=b cost=1.0")
    dispatch = wait_for(lambda: _line(run.dispatcher, f"fair dispatch task={task} "),
                        timeout=10, what="the dispatch line")
    assert f"DEBUG/MainProcess] fair dispatch task={task} group=quick " \
           f"queue={queue} dispatch=" in dispatch
    release = wait_for(lambda: _line(run.worker, f"fair release task={task} "),
                       timeout=10, what="the release line")
    assert f"fair release task={task} group=quick queue={queue} dispatch=" in release
    assert "reason=returned done=True" in release


def test_worker_logs_that_celery_fair_is_attached(run: Run) -> None:
    line = _line(run.worker, "celery-fair attached")
    assert line is not None
    queue, namespace = run.app.conf.task_default_queue, run.app.conf.fair_key_prefix
    assert (f"INFO/MainProcess] celery-fair attached: store {run.store} "
            f"(namespace '{namespace}'), fair queues {queue}, pool 1") in line, line
    assert SECRET not in run.worker.output(tail=10**7)


def test_dispatcher_and_worker_log_in_utc_whatever_their_zone(run: Run) -> None:
    line = wait_for(lambda: _line(run.dispatcher, "celery_fair dispatcher started"),
                    timeout=20, what="the dispatcher's start line")
    attached = _line(run.worker, "celery-fair attached")
    assert attached is not None
    now = datetime.now(timezone.utc)
    started = datetime.fromtimestamp(run.started, timezone.utc)
    for stamp in (_stamp(line), _stamp(attached)):
        # Local time in TZ=Asia/Kolkata would be 5.5 hours ahead of UTC.
        assert started.replace(microsecond=0) <= stamp <= now, (stamp, started, now)


def test_log_utc_false_leaves_the_local_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # The worker's part, in this process: what Celery's logging setup signals then do.
    # (Not log_in_utc(True): it would convert this test process's own handlers.)
    monkeypatch.setattr(logtime, "_wanted", logtime._wanted)  # restored afterwards
    logger = logging.getLogger("test_reporting.local")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    monkeypatch.setattr(logger, "handlers", [handler])
    log_in_utc(False, existing=False)  # fair_log_utc = False
    signals.after_setup_logger.send(sender=None, logger=logger)
    assert handler.formatter is not None
    assert handler.formatter.converter is time.localtime
    log_in_utc(True, existing=False)  # the default
    signals.after_setup_task_logger.send(sender=None, logger=logger)
    assert handler.formatter.converter is time.gmtime
    record = logging.makeLogRecord({"msg": "x", "created": 0.0, "msecs": 5.0})
    assert handler.formatter.formatTime(record) == "1970-01-01T00:00:00.005Z"


@pytest.mark.parametrize("value", [-1, "10", True, float("nan"), None])
def test_a_bad_report_interval_is_refused_naming_the_setting(value: Any) -> None:
    app = Celery("bad", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.fair_report_interval = value
    with pytest.raises(ConfigurationError) as info:
        FairConfig.from_app(app)
    assert f"setting fair_report_interval={value!r} is invalid: expected a positive " \
           "number of seconds, or 0 (no report)" in str(info.value)


def test_a_report_interval_of_zero_turns_the_report_off() -> None:
    app = Celery("off", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.fair_report_interval = 0
    assert FairConfig.from_app(app).report_interval == 0


def test_a_published_dispatch_and_a_skipped_copy_log_their_debug_lines(
        make_app: Any, caplog: pytest.LogCaptureFixture) -> None:
    # The kombu-publish path (no direct push) and a worker's begin on a copy of a task
    # that already ran: the store's own answers, on the real Redis and broker.
    app = make_app(fair_direct_push=False, fair_max_inflight=5)
    queue = app.conf.task_default_queue
    caplog.set_level(logging.DEBUG, logger="celery_fair")
    task_id = app.tasks["proj.work"].delay("acme", "x").id
    dispatcher = Dispatcher(app)
    try:
        assert dispatcher.step().dispatched == 1
    finally:
        dispatcher.close()
    [line] = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith(f"fair dispatch task={task_id} ")]
    found = re.fullmatch(f"fair dispatch task={task_id} group=acme queue={queue} "
                         r"dispatch=(\S+) class=b via=publish", line)
    assert found, line
    headers = {"id": task_id, GROUP_HEADER: "acme", DISPATCH_HEADER: found.group(1),
               QUEUE_HEADER: queue}
    assert begin_dispatch(app, headers) is BeginResult.RUN
    release_dispatch(app, headers, "returned", done=True)
    assert begin_dispatch(app, headers) is BeginResult.SKIP  # the broker redelivered it
    assert f"fair begin-skip task={task_id} group=acme queue={queue} " \
           f"dispatch={found.group(1)}" in caplog.messages
