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
def prefork_worker(app: Any, namespace: str, tmp_path: Any, other: str,
                   conf: dict[str, Any]) -> Iterator[CeleryProcess]:
    """One prefork worker process of SLOTS children consuming both fair queues,
    registered with the store."""
    queue = app.conf.task_default_queue
    conf = {**conf, "fair_store_url": app.conf.fair_store_url}
    proc = CeleryProcess(["worker", "-P", "prefork", "-c", str(SLOTS), "-Q",
                          f"{queue},{other}", "--without-mingle", "--without-gossip",
                          "-l", "INFO", "-n", f"w-{namespace}@%h"],
                         conf, app.conf.broker_url, namespace, tmp_path / "worker.log")
    try:
        store = store_for(app)
        wait_for(lambda: store.worker_capacity(queue, now_ms()) == SLOTS
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
    with prefork_worker(app, namespace, tmp_path, other, conf), dispatcher(app):
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
