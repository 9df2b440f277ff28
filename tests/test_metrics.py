"""The dispatcher's /metrics endpoint, scraped over HTTP while a real worker runs tasks;
its figures are checked against the store."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from celery_fair.metrics import OTHER, DispatcherMetrics
from celery_fair.task import store_for
from celery_fair.testing import free_port

from .conftest import wait_for
from .helpers import queue_of, settled
from .procs import CeleryProcess


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the endpoint: {(name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def series(samples: dict[Any, float], name: str, **labels: str) -> dict[str, float]:
    """Samples named ``name`` matching ``labels``, keyed by their remaining labels."""
    out = {}
    for (sample, found), value in samples.items():
        found_map = dict(found)
        if sample == name and all(found_map.get(k) == v for k, v in labels.items()):
            rest = {k: v for k, v in found_map.items() if k not in labels and k != "le"}
            if "le" in found_map:
                continue
            out[",".join(f"{k}={v}" for k, v in sorted(rest.items()))] = value
    return out


@contextmanager
def served(dispatcher_thread: Any, groups: int) -> Iterator[tuple[DispatcherMetrics, int]]:
    metrics = DispatcherMetrics(dispatcher_thread.dispatcher, groups).attach()
    port = metrics.serve(0, "127.0.0.1")
    try:
        with dispatcher_thread:
            yield metrics, port
    finally:
        metrics.close()


def test_metrics_match_the_store_while_a_worker_runs(make_app, worker, dispatcher) -> None:
    app = make_app(fair_default_concurrency=1, fair_group_weights={"big": 2})
    queue = queue_of(app)
    store = store_for(app)
    work = app.tasks["proj.work"]
    for tenant, count in (("big", 4), ("mid", 3), ("small", 1)):
        for i in range(count):
            work.delay(tenant, f"{tenant}-{i}", 1.5)
    app.tasks["proj.preview"].delay("small", "p", 1.5)

    with served(dispatcher(app), groups=2) as (metrics, port):
        # The weights are the dispatcher's settings, written when it first serves the queue.
        wait_for(lambda: series(scrape(port), "celery_fair_group_weight", queue=queue)
                 .get("group=big") == 2.0, what="the dispatcher to configure the queue")
        # No worker yet, so no capacity: the held figures stand still and must equal the
        # store's, the two biggest groups on their own, the rest under _other.
        s = scrape(port)
        assert series(s, "celery_fair_held_tasks", queue=queue, **{"class": "background"}) \
            == {"group=big": 4, "group=mid": 3, f"group={OTHER}": 1}
        assert series(s, "celery_fair_held_tasks", queue=queue, **{"class": "interactive"}) \
            == {"group=big": 0, "group=mid": 0, f"group={OTHER}": 1}
        assert series(s, "celery_fair_group_weight", queue=queue) == \
            {"group=big": 2.0, "group=mid": 1.0}
        assert series(s, "celery_fair_group_cap", queue=queue) == {"group=big": 1,
                                                                    "group=mid": 1}
        assert s[("celery_fair_capacity", (("queue", queue),))] == 0
        assert s[("celery_fair_active_groups", (("queue", queue),))] == 3
        assert 0 <= s[("celery_fair_loop_lag_seconds", ())] < 2

        with worker(concurrency=4):
            # cap 1 per group: small's preview (interactive, first), big and mid run for
            # 1.5 s; in that window the in-flight figures stand still.
            wait_for(lambda: store.queue_figures(queue).inflight == 3,
                     what="three tasks in flight")
            s = scrape(port)
            assert series(s, "celery_fair_inflight_tasks", queue=queue) == \
                {"group=big": 1, "group=mid": 1, f"group={OTHER}": 1}
            # the worker's 4 slots (summary.Capacity: the dispatch-ahead is apart)
            assert s[("celery_fair_capacity", (("queue", queue),))] == 4
            wait_for(lambda: settled(app), what="every task done and released")

        s = scrape(port)
    stat = store.queue_figures(queue)
    assert stat.released == 9
    assert s[("celery_fair_released_total", (("queue", queue),))] == 9
    assert stat.skipped == 0  # no copy was delivered twice
    assert s[("celery_fair_skipped_total", (("queue", queue),))] == 0
    assert series(s, "celery_fair_dispatched_total", queue=queue) == \
        {"class=background": 8, "class=interactive": 1}
    assert series(s, "celery_fair_wait_seconds_count", queue=queue) == \
        {"class=background": 8, "class=interactive": 1}
    # the last tasks waited for the first ones (1.5 s each, one per group at a time)
    assert s[("celery_fair_wait_seconds_sum", (("class", "background"), ("queue", queue)))] \
        > 1.5
    # at most 2 groups of their own (a group displaced from the top loses its series)
    per_group = series(s, "celery_fair_group_wait_seconds_count", queue=queue)
    assert len(set(per_group) - {f"group={OTHER}"}) <= 2 and sum(per_group.values()) <= 9
    assert "group=big" in per_group  # the biggest group throughout
    assert series(s, "celery_fair_held_tasks", queue=queue, group=OTHER) == \
        {"class=background": 0, "class=interactive": 0}
    assert s[("celery_fair_step_seconds_count", ())] > 0


def test_group_wait_series_are_capped_and_kept_until_displaced(make_app, dispatcher) -> None:
    app = make_app()
    queue = queue_of(app)
    store = store_for(app)
    work = app.tasks["proj.work"]
    for tenant, count in (("a", 4), ("b", 3), ("c", 1)):
        for _ in range(count):
            work.delay(tenant)
    metrics = DispatcherMetrics(dispatcher(app).dispatcher, 2)

    def observe(group: str) -> str:
        label = metrics.wait_label(queue, group)
        metrics.group_wait.labels(queue, label).observe(1.0)
        return label

    def labelled() -> set[str]:
        return {x.labels["group"] for x in metrics.group_wait.collect()[0].samples}

    assert metrics.top_groups(queue) == ["a", "b"]
    assert [observe(g) for g in ("c", "a", "b", "a")] == [OTHER, "a", "b", "a"]
    assert labelled() == {"a", "b", OTHER}
    # b's backlog goes (cancelled) and c grows into the top two: c takes b's place
    b_ids = [i.decode() for i in store.client.lrange(store.keys(queue).held("b", "b"), 0, -1)]
    assert len(store.cancel(queue, b_ids)) == 3
    work.delay("c")
    work.delay("c")
    metrics._top.clear()  # the ranking is re-read every few seconds; now, here
    assert metrics.top_groups(queue) == ["a", "c"]
    assert observe("b") == "b"  # still has its series: nobody needed its place yet
    assert [observe(g) for g in ("c", "b", "a")] == ["c", OTHER, "a"]
    assert labelled() == {"a", "c", OTHER}


def test_lease_reclaims_are_counted(make_app, dispatcher) -> None:
    app = make_app()
    queue = queue_of(app)
    store = store_for(app)
    app.tasks["proj.work"].delay("acme", "x")
    # Another dispatcher picked the message and died before publishing it.
    now = int(time.time() * 1000)
    assert len(store.pick(queue, 1, None, now, 1)) == 1
    with served(dispatcher(app), groups=5) as (metrics, port):
        wait_for(lambda: series(scrape(port), "celery_fair_lease_reclaims_total",
                                queue=queue) == {"outcome=requeued": 1},
                 what="the reclaim counted")
        # the top groups are re-read every few seconds, and acme held nothing at the
        # first scrape (its message was picked): read them now
        metrics._top.clear()
        s = scrape(port)
    assert series(s, "celery_fair_held_tasks", queue=queue, group="acme") == \
        {"class=background": 1, "class=interactive": 0}


def test_cli_dispatcher_serves_metrics(make_app, redis_server, namespace, tmp_path) -> None:
    app = make_app()
    app.tasks["proj.work"].delay("acme", "x")
    port = free_port()
    proc = CeleryProcess(["fair", "dispatch", "--metrics-port", str(port),
                          "--metrics-address", "127.0.0.1"], {}, redis_server.url + "/0",
                         namespace, tmp_path / "dispatch.log")
    try:
        def scraped() -> Any:
            try:
                return scrape(port)
            except OSError:
                assert proc.alive(), proc.output()
                return None

        s = wait_for(scraped, what="the dispatcher's /metrics endpoint")
        assert series(s, "celery_fair_held_tasks", queue=queue_of(app), group="acme") == \
            {"class=background": 1, "class=interactive": 0}
    finally:
        assert proc.stop() == 0, proc.output()


def test_head_waits_keep_the_longest_waiting_groups_not_the_biggest(
        make_app, dispatcher) -> None:
    app = make_app()  # no worker: no capacity, everything stays held
    queue = queue_of(app)
    work = app.tasks["proj.work"]
    work.delay("small")  # one task, held first: the longest-waiting head
    time.sleep(0.05)  # a head due measurably later (ms resolution)
    for tenant, count in (("big", 5), ("mid", 3)):
        for _ in range(count):
            work.delay(tenant)
    with served(dispatcher(app), groups=1) as (_, port):
        s = wait_for(lambda: (got := scrape(port)) and series(
            got, "celery_fair_group_head_wait_seconds", queue=queue) and got,
            what="the head-wait series")
    # one series per queue (fair_metrics_groups=1): small's, though big holds the most
    assert list(series(s, "celery_fair_held_tasks", queue=queue,
                       **{"class": "background"})) == ["group=big", f"group={OTHER}"]
    heads = series(s, "celery_fair_group_head_wait_seconds", queue=queue)
    assert list(heads) == ["group=small"]
    oldest = series(s, "celery_fair_oldest_head_wait_seconds", queue=queue)[""]
    assert oldest == heads["group=small"] >= series(
        s, "celery_fair_group_oldest_wait_seconds", queue=queue)["group=big"] + 0.04


def test_a_served_backlog_shows_a_short_head_wait_and_a_paused_tenant_a_growing_one(
        make_app, worker, dispatcher) -> None:
    """The tip-of-queue wait counts from when a task became its group's head: three
    big backlogs served steadily by a real worker show short head waits (their oldest
    tasks have waited far longer), while a paused one-task tenant shows a head wait
    that grows; with ``fair_metrics_groups`` = 1 its series is the one kept."""
    app = make_app()
    queue = queue_of(app)
    work = app.tasks["proj.work"]
    work.delay("small", "s")
    store_for(app).pause(queue, "small", None)  # fair pause: until resumed
    for tenant in ("big1", "big2", "big3"):
        for i in range(40):
            work.delay(tenant, f"{tenant}-{i}", 0.05)
    thread = dispatcher(app)
    wide = DispatcherMetrics(thread.dispatcher, 10)  # every group's series
    wide_port = wide.serve(0, "127.0.0.1")
    try:
        with worker(concurrency=2), served(thread, groups=1) as (_, port):
            def steady() -> dict[str, float] | None:
                s = scrape(wide_port)
                heads = series(s, "celery_fair_group_head_wait_seconds", queue=queue)
                oldest = series(s, "celery_fair_group_oldest_wait_seconds", queue=queue)
                big = {g: w for g, w in heads.items() if g.startswith("group=big")}
                served_long = [g for g in big if oldest.get(g, 0) >= 1.5]
                return big if served_long and all(big[g] <= 1.0 for g in served_long) \
                    else None
            big = wait_for(steady, what="served backlogs with short head waits")
            assert all(wait <= 1.0 for wait in big.values()), big

            def small_head() -> float:
                s = scrape(port)
                heads = series(s, "celery_fair_group_head_wait_seconds", queue=queue)
                assert list(heads) == ["group=small"], heads  # the bound keeps the tenant
                assert s[("celery_fair_oldest_head_wait_seconds", (("queue", queue),))] \
                    == heads["group=small"]
                return heads["group=small"]
            first = small_head()
            assert first >= 1.5  # held before the backlogs, never picked
            wait_for(lambda: small_head() >= first + 0.5, what="the paused head to age")
            held = series(scrape(port), "celery_fair_held_tasks", queue=queue,
                          **{"class": "background"})
            assert "group=small" not in held  # not one of the biggest backlogs
    finally:
        wide.close()
