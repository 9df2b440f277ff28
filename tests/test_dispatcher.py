"""The dispatcher's loop (celery_fair/dispatcher.py) against a real Redis, real workers:
what an observer's failure, a store outage and wake-ups do to it."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable

import pytest
from celery import Celery

from celery_fair.dispatcher import MAX_BACKOFF_SECONDS
from celery_fair.testing import RedisServer

from .conftest import wait_for
from .helpers import wait_settled


def _records(caplog: Any, text: str, level: int = logging.WARNING) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "celery_fair.dispatcher"
            and r.levelno == level and text in r.getMessage()]


# -- observers (metrics) -------------------------------------------------------------------

class RaisingObserver:
    """An observer whose every hook fails, as metrics do when their Redis read fails."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def on_dispatch(self, queue: str, group: str, klass: str, due_at: float | None) -> None:
        self.calls["dispatch"] += 1
        raise RuntimeError("metrics: top_groups failed")

    def on_reclaim(self, queue: str, requeued: int, lost: int) -> None:
        self.calls["reclaim"] += 1
        raise RuntimeError("metrics: reclaim hook failed")

    def on_step(self, seconds: float) -> None:
        self.calls["step"] += 1
        raise RuntimeError("metrics: step hook failed")


@pytest.mark.parametrize("direct_push", [True, False], ids=["direct-push", "publish"])
def test_an_observer_that_raises_never_stops_dispatching(
        make_app: Callable[..., Celery], worker: Callable[..., Any],
        dispatcher: Callable[..., Any], caplog: Any, direct_push: bool) -> None:
    app = make_app(fair_direct_push=direct_push)
    caplog.set_level(logging.DEBUG, logger="celery_fair")
    observer = RaisingObserver()
    work = app.tasks["proj.work"]
    labels = [f"t{i % 3}-{i}" for i in range(30)]
    running = dispatcher(app)
    running.dispatcher.observer = observer
    with worker(concurrency=4, the_app=app), running:
        results = [work.delay(label.split("-")[0], label) for label in labels]
        assert sorted(r.get(timeout=30) for r in results) == sorted(labels)
        wait_settled(app)  # every slot released: each dispatch was confirmed and ran
    assert app.ledger.runs() == {label: 1 for label in labels}  # type: ignore[attr-defined]
    assert observer.calls["dispatch"] == len(labels)  # each dispatch was still reported
    # no step failed, so no backoff and no reclaim of unconfirmed picks
    assert not _records(caplog, "dispatcher step failed"), caplog.text
    assert not _records(caplog, "reclaimed"), caplog.text
    # the observer's failure: one warning for the whole burst, not one per message
    assert len(_records(caplog, "observer (metrics) failed")) == 1, caplog.text


# -- a store outage -------------------------------------------------------------------------

@pytest.fixture
def store_server() -> Any:
    server = RedisServer()
    yield server
    server.stop()


@pytest.mark.parametrize("known", [False, True], ids=["no-queue-yet", "serving-a-queue"])
def test_a_store_outage_is_logged_once_and_retries_back_off_to_the_cap(
        make_app: Callable[..., Celery], dispatcher: Callable[..., Any],
        store_server: RedisServer, caplog: Any, known: bool) -> None:
    """While the store is away every retry fails; the waits between them double up to
    MAX_BACKOFF_SECONDS (seen in the log records' timestamps) and the outage is one
    warning when it starts and one when it ends: the dispatcher never flips between
    "failed" and "works again" in between."""
    app = make_app(fair_store_url=store_server.url + "/0")
    caplog.set_level(logging.DEBUG, logger="celery_fair")
    if known:  # one fair queue held into (no worker: it stays held)
        app.tasks["proj.work"].delay("acme", "held")
    with dispatcher(app):
        wait_for(lambda: _records(caplog, "dispatcher started", logging.INFO),
                 what="the dispatcher to start")
        if known:
            wait_for(lambda: _records(caplog, "serving fair queue", logging.INFO),
                     what="the dispatcher to serve the queue")
        store_server.halt()

        def failures() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.name == "celery_fair.dispatcher"
                    and r.getMessage().startswith("dispatcher step failed")]

        # 0.1 + 0.2 + ... + 3.2, then twice the 5 s cap: about 16 s
        wait_for(lambda: len(failures()) >= 9, timeout=60, interval=0.05,
                 what="nine failed attempts")
        store_server.start()
        wait_for(lambda: _records(caplog, "dispatcher step works again"), timeout=30,
                 what="the dispatcher to notice the store is back")
    times = [r.created for r in failures()[:9]]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert len(_records(caplog, "dispatcher step failed")) == 1, caplog.text
    assert len(_records(caplog, "dispatcher step works again")) == 1, caplog.text
    # each wait at least the one before (0.1, 0.2, 0.4 ...; a little timing slack)...
    assert all(b >= a * 0.9 for a, b in zip(gaps, gaps[1:])), gaps
    # ...up to the cap, and no further
    assert all(MAX_BACKOFF_SECONDS * 0.9 <= g <= MAX_BACKOFF_SECONDS + 1.5
               for g in gaps[-2:]), gaps
