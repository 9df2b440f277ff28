"""The dispatcher's loop (celery_fair/dispatcher.py) against a real Redis, real workers:
what an observer's failure, a store outage and wake-ups do to it."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable

import pytest
from celery import Celery

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
