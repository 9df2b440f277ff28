"""The per-queue summary the dispatcher keeps in Redis for dashboards (celery_fair/summary.py)."""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import pytest

from celery_fair.dispatcher import Dispatcher
from celery_fair.envelope import Envelope
from celery_fair.store.base import Placement
from celery_fair.store.redis import RedisStore
from celery_fair.summary import (
    EXTRA_TOTALS,
    SUMMARY_VERSION,
    Capacity,
    SummaryWriter,
    build_summary,
    read_summaries,
    release_rate,
)
from celery_fair.task import store_for
from celery_fair.testing import free_port

from .conftest import wait_for
from .helpers import queue_of, snapshot


def _hold_mix(app) -> tuple[float, float]:
    """big: 5 background; acme: 2 background + 1 interactive; small: 1 background.
    Returns the time range in which acme's first task was held."""
    work, preview = app.tasks["proj.work"], app.tasks["proj.preview"]
    before = time.time()
    work.delay("acme", "a1")
    after = time.time()
    work.delay("acme", "a2")
    preview.delay("acme", "p1")
    for i in range(5):
        work.delay("big", f"b{i}")
    work.delay("small", "s1")
    return before, after


def _by_group(summary):
    return {g["group"]: g for g in summary["groups"]}


def test_summary_matches_the_store(make_app):
    app = make_app(fair_max_inflight=1, fair_group_concurrency={"big": 3},
                   fair_group_weights={"acme": 2})
    queue = queue_of(app)
    before, after = _hold_mix(app)
    dispatcher = Dispatcher(app)
    try:
        dispatcher.step()  # picks acme's interactive task, starts writing the summary
    finally:
        dispatcher.close()
    summary = wait_for(lambda: read_summaries(store_for(app))[queue], what="the summary")
    written = time.time()
    snap = snapshot(app)
    assert summary["inflight"] == snap["inflight"] == 1
    assert (summary["capacity"], summary["dispatch_ahead"], summary["inflight_limit"]) == \
        (1, 0, 1)  # a fixed fair_max_inflight: no dispatch-ahead
    assert summary["groups_total"] == len(snap["groups"]) == 3
    assert (summary["held_interactive"], summary["held_background"]) == (0, 8)
    for g in snap["groups"]:
        shown = _by_group(summary)[g["group"]]
        for field in ("held_interactive", "held_background", "delayed", "inflight", "cap",
                      "weight"):
            assert shown[field] == g[field], (g["group"], field)
    # sorted by held, most first
    assert [g["group"] for g in summary["groups"]] == ["big", "acme", "small"]
    assert _by_group(summary)["big"]["cap"] == 3
    assert _by_group(summary)["acme"]["weight"] == 2.0
    # acme's head is its first background task (the interactive one was dispatched)
    wait = _by_group(summary)["acme"]["oldest_wait"]
    assert summary["written_at"] - after - 0.01 <= wait <= written - before + 0.01
    assert summary["oldest_wait"] == wait  # acme's task is the oldest held
    assert 0 < store_for(app).client.ttl(store_for(app).keys(queue).summary) <= 10


def test_summary_lists_the_groups_holding_most_and_counts_all(make_app):
    app = make_app()
    _hold_mix(app)
    summary = build_summary(store_for(app), queue_of(app), Capacity(0, 0), limit=2)
    assert [g["group"] for g in summary["groups"]] == ["big", "acme"]
    assert summary["groups_total"] == 3
    assert summary["held_background"] == 8 and summary["held_interactive"] == 1


def test_summary_totals_are_exact_and_only_the_listed_groups_are_read(make_app,
                                                                      monkeypatch):
    """More groups than the limit, some with only in-flight or delayed work: the totals
    still count every group (the store's counters), and only the listed groups' keys are
    read (O(limit), whatever the number of groups)."""
    app = make_app()
    work = app.tasks["proj.work"]
    for i in range(30):
        work.delay(f"g{i:02d}", "x")
    for i in range(4):
        work.delay("big", f"b{i}")
    app.tasks["proj.preview"].delay("inter", "p")
    work.apply_async(("later", "x"), countdown=60)
    store, queue = store_for(app), queue_of(app)
    now = int(time.time() * 1000)
    assert len(store.pick(queue, 3, None, now, 10_000)) == 3  # "inter" first: in flight
    read: list[str] = []
    for name in ("summarize", "group_figures"):
        original = getattr(store, name)
        monkeypatch.setattr(store, name, lambda q, groups, _o=original: (
            read.extend(groups), _o(q, groups))[1])
    summary = build_summary(store, queue, None, limit=5)
    monkeypatch.undo()
    snap = snapshot(app)
    assert summary["groups_total"] == len(snap["groups"]) == 33
    for field in ("held_interactive", "held_background", "delayed", "inflight",
                  *EXTRA_TOTALS):
        assert summary[field] == snap[field], field
    assert sum(g["held_background"] + g["held_interactive"] for g in snap["groups"]) == \
        summary["held_background"] + summary["held_interactive"] == 32
    assert (summary["delayed"], summary["inflight"]) == (1, 3)
    listed = [g["group"] for g in summary["groups"]]
    assert len(listed) == 5 and listed[0] == "big"
    assert set(read) == set(listed)  # no other group was read


def test_oldest_wait_counts_from_the_eta_not_the_hold(make_app):
    app = make_app()
    app.tasks["proj.work"].apply_async(("late", "x"), countdown=1.5)
    store = store_for(app)
    queue = queue_of(app)
    summary = build_summary(store, queue, Capacity(0, 0))
    assert summary["delayed"] == 1 and summary["oldest_wait"] is None
    time.sleep(1.6)  # the countdown itself is what is being measured
    store.promote(queue, int(time.time() * 1000), 10)
    summary = build_summary(store, queue, Capacity(0, 0))
    assert summary["held_background"] == 1
    assert 0 <= summary["oldest_wait"] < 0.5


def test_the_hold_records_its_due_time_first_in_the_meta(make_app):
    app = make_app()
    before = time.time()
    result = app.tasks["proj.work"].delay("acme", "x")
    store = store_for(app)
    value = store.client.hget(store.keys(queue_of(app)).msg, result.id)
    group, _, envelope = Envelope.decode(value)
    assert group == "acme"
    assert before <= envelope.due_at <= time.time()
    meta = value[value.index(b"acme") + 4:value.index(b"\n")]
    assert next(iter(json.loads(meta))) == "t"


def test_a_message_held_without_due_time_has_no_wait(make_app):
    """Messages held before due times were recorded still show up, without a wait."""
    app = make_app()
    store = store_for(app)
    queue = queue_of(app)
    envelope = Envelope(body=b"[]", content_type="application/json",
                        content_encoding="utf-8", headers={"id": "old", "task": "t"},
                        exchange="", routing_key=queue, queue=queue)
    now = int(time.time() * 1000)
    legacy = Placement("legacy", "b", 1.0, False)
    store.hold(queue, "old", envelope.encode("legacy", "b", 1, False), legacy, 0, now)
    summary = build_summary(store, queue, None)
    assert _by_group(summary)["legacy"]["held_background"] == 1
    assert _by_group(summary)["legacy"]["oldest_wait"] is None
    assert summary["capacity"] is None


def test_the_head_wait_counts_from_when_the_head_became_the_head(make_app):
    """A group served a minute after its tasks were held shows its oldest task's whole
    wait, and a head wait from the pick that made its next task the head."""
    app = make_app()
    store, queue = store_for(app), queue_of(app)
    now = time.time()
    for i in range(3):
        envelope = Envelope(body=b"[]", content_type="application/json",
                            content_encoding="utf-8", headers={"id": f"a{i}", "task": "t"},
                            exchange="", routing_key=queue, queue=queue, due_at=now - 60)
        store.hold(queue, f"a{i}", envelope.encode("acme", "b", 1, False),
                   Placement("acme", "b", 1.0, False), 0, int((now - 60) * 1000))
    store.pick(queue, 1, None, int((now - 5) * 1000), 60_000)
    summary = build_summary(store, queue, None, now=now)
    acme = _by_group(summary)["acme"]
    assert acme["oldest_wait"] == 60.0
    assert acme["head_wait"] == summary["head_wait"] == pytest.approx(5.0, abs=0.002)


def test_one_dispatcher_writes_per_interval(make_app):
    app = make_app()
    _hold_mix(app)
    store = store_for(app)
    first, second = SummaryWriter(store, interval=5), SummaryWriter(store, interval=5)
    assert first.write(queue_of(app), Capacity(0, 0)) is True
    assert second.write(queue_of(app), Capacity(0, 0)) is False  # another dispatcher just wrote it


def test_summarize_script_reads_counts_and_head_due_times(make_app):
    app = make_app()
    store = store_for(app)
    queue = queue_of(app)
    work = app.tasks["proj.work"]
    work.delay("acme", "a1")
    work.apply_async(("acme", "later"), countdown=60)
    [acme, nobody] = store.summarize(queue, ["acme", "nobody"])
    assert (acme.held_interactive, acme.held_background, acme.inflight, acme.delayed) == \
        (0, 1, 0, 1)
    assert acme.due_interactive is None and acme.due_background is not None
    assert nobody == type(nobody)("nobody", 0, 0, 0, 0, None, None)
    assert store.summarize(queue, []) == []


def test_the_writer_works_in_a_thread_once_per_interval(make_app):
    app = make_app()
    _hold_mix(app)
    store = store_for(app)
    queue = queue_of(app)
    writer = SummaryWriter(store, interval=30)
    writer.maybe_write([queue], {queue: Capacity(4, 2)})
    first = writer._thread
    assert first is not None
    summary = wait_for(lambda: read_summaries(store)[queue], what="the first round")
    assert (summary["capacity"], summary["dispatch_ahead"], summary["inflight_limit"]) == \
        (4, 2, 6)
    assert summary["held_background"] == 8
    store.client.delete(store.keys(queue).summary)
    writer.maybe_write([queue], {queue: Capacity(4, 2)})  # within the interval: nothing to do
    assert writer._thread is first
    assert read_summaries(store)[queue] is None
    writer.stop()


def test_the_writer_keeps_one_thread_over_many_rounds(make_app, dispatcher, monkeypatch):
    """A running dispatcher writes a summary round about every second, all in the same
    thread: no thread is started per round."""
    app = make_app()
    _hold_mix(app)
    store, queue = store_for(app), queue_of(app)
    started: list[str] = []
    start = threading.Thread.start

    def counting_start(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    rounds: set[float] = set()
    alive: list[int] = []

    def five_rounds() -> bool:
        summary = read_summaries(store)[queue]
        if summary is not None:
            rounds.add(summary["written_at"])
            alive.append(threading.active_count())
        return len(rounds) >= 5

    with dispatcher(app):
        wait_for(five_rounds, timeout=30, interval=0.05, what="five summary rounds")
    assert started.count("celery-fair-summary") == 1, started
    assert max(alive) == min(alive), alive  # the thread count stays flat


def test_a_store_outage_is_logged_once_by_the_summary_writer(caplog):
    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", "nowhere")
    writer = SummaryWriter(store)
    caplog.set_level(logging.DEBUG, logger="celery_fair.summary")

    def failures(*levels: int) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "celery_fair.summary"
                and r.levelno in levels and "summar" in r.getMessage()]

    def rounds_failed() -> bool:
        writer.maybe_write(["q1", "q2"], {})  # as the dispatcher does every step
        # Two rounds: the second is the first to repeat the outage. (A failed round waits
        # ten times as long as it took before the next: 14 s with the store's retries.)
        return len(failures(logging.DEBUG, logging.WARNING)) >= 4

    try:
        wait_for(rounds_failed, timeout=40, interval=0.05, what="two failed rounds")
    finally:
        writer.stop()
    assert len(failures(logging.WARNING)) == 1, caplog.text


def test_the_release_rate_is_smoothed_from_the_previous_summary() -> None:
    def doc(at: float, released: int, rate: float | None = None) -> dict[str, Any]:
        return {"version": SUMMARY_VERSION, "written_at": at, "released": released,
                "release_rate": rate}

    assert release_rate(None, doc(100.0, 10)) is None  # no basis yet
    assert release_rate(json.dumps(doc(99.0, 4)), doc(100.0, 10)) == 6.0
    smoothed = release_rate(json.dumps(doc(99.0, 4, 2.0)), doc(100.0, 10))
    assert smoothed is not None and 2.0 < smoothed < 6.0  # the old rate weighs most
    assert release_rate(json.dumps(doc(40.0, 4, 2.0)), doc(100.0, 10)) is None  # stale
    assert release_rate(json.dumps(doc(99.0, 40, 2.0)), doc(100.0, 10)) is None  # reset
