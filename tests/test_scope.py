"""``fair_scope = "app"`` end to end (issue 12 item 6): a real prefork worker process
consuming two fair queues, a real dispatcher, the real Redis store and the SQL store on
PostgreSQL (``store_backend``). Each task counts
itself in and out of its group in the ledger (tests/proj.py ``proj.work``: the most of
a group running at once, counted inside the tasks), so "a cap of 1 across both queues"
is measured where the tasks run; with scope 'queue' the same load runs the capped group
once per queue."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import select

from celery_fair.cli_render import policy_cell
from celery_fair.config import get_config
from celery_fair.directory import policy_of
from celery_fair.store.redis import now_ms
from celery_fair.task import store_for

from .conftest import wait_for
from .procs import CeleryProcess

SLOTS, TASKS = 4, 24
CONF: dict[str, Any] = {"fair_lease_seconds": 5, "worker_prefetch_multiplier": 1,
                        "fair_group_concurrency": {"a": 1}}


@contextmanager
def prefork_worker(app: Any, namespace: str, tmp_path: Any, queues: list[str],
                   conf: dict[str, Any], slots: int = SLOTS) -> Iterator[CeleryProcess]:
    """One prefork worker process of ``slots`` children consuming ``queues``,
    registered with the store."""
    conf = {**conf, "fair_store_url": app.conf.fair_store_url}
    name = f"w{len(list(tmp_path.glob('worker*.log')))}-{namespace}@%h"
    proc = CeleryProcess(["worker", "-P", "prefork", "-c", str(slots), "-Q",
                          ",".join(queues), "--without-mingle", "--without-gossip",
                          "-l", "INFO", "-n", name],
                         conf, app.conf.broker_url, namespace,
                         tmp_path / f"worker-{name.split('-')[0]}.log")
    try:
        store = store_for(app)
        wait_for(lambda: store.worker_capacity(queues[0], now_ms()) == slots
                 or not proc.alive(), timeout=60, what="the worker registered")
        assert proc.alive(), proc.output()
        yield proc
    finally:
        proc.stop()


@pytest.mark.parametrize("scope", ["app", "queue"])
def test_a_cap_of_one_holds_across_two_queues(make_app: Any, dispatcher: Any,
                                              namespace: str, tmp_path: Any,
                                              scope: str, store_backend: str) -> None:
    conf = {**CONF, "fair_scope": scope}
    app = make_app(**conf)
    work, ledger = app.tasks["proj.work"], app.ledger
    other = f"{app.conf.task_default_queue}-two"
    # a's tasks every other one to the second queue, b's beside them to fill the slots
    results = [work.apply_async(("a", f"a{n}", 0.2), queue=other if n % 2 else None)
               for n in range(TASKS)]
    results += [work.apply_async(("b", f"b{n}", 0.2), queue=other if n % 2 else None)
                for n in range(TASKS // 2)]
    queues = [app.conf.task_default_queue, other]
    with prefork_worker(app, namespace, tmp_path, queues, conf), dispatcher(app):
        for r in results:
            r.get(timeout=120)
    runs = ledger.runs()
    assert len(runs) == TASKS + TASKS // 2 and set(runs.values()) == {1}  # each ran once
    most = ledger.max_running()
    if scope == "app":
        assert most["a"] == 1, most  # never two of a at once, in either queue
    else:
        assert most["a"] == 2, most  # its cap once per queue
    assert ledger.max_all() > 1  # b ran beside a
    store = store_for(app)
    for q in (app.conf.task_default_queue, other):
        assert store.snapshot(q)["inflight"] == 0
    assert app_counts(store) == {}  # nothing left counted


@pytest.mark.parametrize("scope", ["app", "queue"])
def test_a_group_served_in_another_queue_waits_its_turn(make_app: Any, dispatcher: Any,
                                                        namespace: str, tmp_path: Any,
                                                        scope: str,
                                                        store_backend: str) -> None:
    """wfq shares across queues, as the tasks start: a and b both wait in the default
    queue; a is then served 4 times in the second queue. With scope 'app' that counts
    against a's share here too, so b starts 4 times first; with scope 'queue' they
    alternate."""
    conf = {"fair_lease_seconds": 5, "worker_prefetch_multiplier": 1, "fair_scope": scope}
    app = make_app(**conf)
    work, ledger = app.tasks["proj.work"], app.ledger
    queue, other = app.conf.task_default_queue, f"{app.conf.task_default_queue}-two"
    here = [work.apply_async((g, f"{g}{n}", 0.02)) for n in range(5) for g in "ab"]
    there = [work.apply_async(("a", f"there{n}", 0.02), queue=other) for n in range(4)]
    with dispatcher(app):
        with prefork_worker(app, namespace, tmp_path, [other], conf, slots=1):
            for r in there:
                r.get(timeout=60)
        assert ledger.runs().keys() == {f"there{n}" for n in range(4)}  # none here yet
        with prefork_worker(app, namespace, tmp_path, [queue], conf, slots=1):
            for r in here:
                r.get(timeout=60)
    starts = [s["group"] for s in ledger.starts() if not s["label"].startswith("there")]
    assert len(starts) == 10, starts
    if scope == "app":
        assert starts[:5] == ["b"] * 4 + ["a"], starts  # a's 4 turns elsewhere counted
    else:
        assert starts[:4] == ["a", "b"] * 2, starts


def app_counts(store: Any) -> dict[str, int]:
    """The app's in-flight count per group (Redis's ``<ns>:scope:n``, SQL's rows)."""
    if hasattr(store, "engine"):
        c = store.t.scope_n.c
        with store.engine.connect() as conn:
            return {g: int(n) for g, n in conn.execute(select(c.grp, c.n).where(
                c.ns == store.namespace))}
    return {g.decode(): int(n) for g, n in
            store.client.hgetall(f"{store.namespace}:scope:n").items()}


def test_the_scope_is_read_per_queue_and_shown(make_app: Any) -> None:
    app = make_app(task_routes={"proj.x": {"queue": "exports"}},
                   fair_queue_policies={"exports": {"fair_scope": "app"}})
    config = get_config(app)
    assert policy_of(config, "exports").scope == "app"
    assert policy_of(config, app.conf.task_default_queue).scope == "queue"
    assert policy_cell({"policy": "wfq", "scope": "app"}) == "wfq, scope app"
    assert policy_cell({"policy": "wfq"}) == "wfq"
