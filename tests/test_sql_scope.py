"""``fair_scope`` 'app' on the SQL stores under concurrent transactions (the contract
test, tests/test_store_contract_scope.py, runs its cases one call at a time): threads
picking and releasing in two app-scoped queues at once never take a capped group past
its cap across both, every message is picked once, and the app's counts end at nothing
with ``fair check`` clean (the count rows' locks, store/sql/scoping.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Callable

import pytest
from sqlalchemy import select

from celery_fair.check import check
from celery_fair.envelope import Envelope
from celery_fair.limits import APP_SCOPE
from celery_fair.store import store_for_url
from celery_fair.store.base import Placement, Policy
from celery_fair.store.sql.store import SqlStore

QUEUES = ("sq1", "sq2")
NOW, LEASE_MS, CAP, PER_QUEUE = 1_000_000, 600_000, 2, 40


@pytest.fixture
def sql_of(sql_url: Callable[[str], str]) -> Iterator[Callable[[str], SqlStore]]:
    """``sql_of(backend)``: a SQL store in a namespace of its own, closed after."""
    made: list[SqlStore] = []

    def make(backend: str) -> SqlStore:
        store = store_for_url(sql_url(backend), "t" + uuid.uuid4().hex[:10])
        assert isinstance(store, SqlStore)
        made.append(store)
        return store

    yield make
    for store in made:
        store.flush()
        store.close()


def hold(store: SqlStore, queue: str, task_id: str, group: str) -> None:
    envelope = Envelope(body=task_id.encode(), content_type="application/json",
                        content_encoding="utf-8", headers={"id": task_id, "task": "t"},
                        exchange="", routing_key=queue, queue=queue)
    store.hold(queue, task_id, envelope.encode(group, "b", 1, False),
               Placement(group, "b", 1.0, False), 0, NOW)


class Flight:
    """The capped group's dispatches in flight as the threads see them: counted up after
    a pick committed, down before its release is sent, so never above the store's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.picked: list[str] = []

    def took(self, hold_ids: list[str]) -> None:
        with self.lock:
            self.picked += hold_ids
            self.now += sum(1 for h in hold_ids if h.startswith("g"))
            self.most = max(self.most, self.now)

    def gives_back(self, hold_id: str) -> None:
        if hold_id.startswith("g"):
            with self.lock:
                self.now -= 1


def run(store: SqlStore, queue: str, flight: Flight, deadline: float,
        errors: list[BaseException]) -> None:
    """Promote, pick up to 3, release what the previous round picked, until the queue
    is empty (or the deadline)."""
    running: list[tuple[str, str]] = []
    try:
        while time.monotonic() < deadline:
            store.promote(queue, NOW, 100)
            got = store.pick(queue, 3, None, NOW, LEASE_MS)
            flight.took([p.hold_id for p in got])
            for hold_id, did in running:
                flight.gives_back(hold_id)
                assert store.release(queue, did)
            running = [(p.hold_id, p.dispatch_id) for p in got]
            if not running and store.queue_figures(queue).held == 0:
                return
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"])
def test_threads_in_two_queues_never_take_a_group_past_its_cap(
        sql_of: Callable[[str], SqlStore], backend: str) -> None:
    sql = sql_of(backend)
    for q in QUEUES:
        sql.configure(q, Policy(None, 0, 1.0, {"g": CAP}, {}, scope=APP_SCOPE))
        for n in range(PER_QUEUE):
            hold(sql, q, f"g-{q}-{n}", "g")
        for n in range(PER_QUEUE // 2):
            hold(sql, q, f"h-{q}-{n}", "h")
    flight, errors = Flight(), []
    deadline = time.monotonic() + 240
    threads = [threading.Thread(target=run, args=(sql, q, flight, deadline, errors))
               for q in QUEUES for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert sorted(flight.picked) == sorted(
        f"{g}-{q}-{n}" for q in QUEUES for g, count in (("g", PER_QUEUE), ("h", PER_QUEUE // 2))
        for n in range(count))  # each once
    assert flight.most == CAP  # reached, never passed, across both queues
    c = sql.t.scope_n.c
    with sql.engine.connect() as conn:
        assert conn.execute(select(c.grp, c.n).where(c.ns == sql.namespace)).all() == []
    report = check(sql, queues=list(QUEUES))
    assert report.ok, report.findings


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"])
def test_a_resend_leaves_no_count_row(sql_of: Callable[[str], SqlStore],
                                      backend: str) -> None:
    """A resend (held once: plain, under backpressure, keyed) locks its group's count row,
    made at 0 to be locked: the row goes with the transaction, as after any step (the
    model test's mariadb-scope leg found one left)."""
    sql = sql_of(backend)
    sql.configure(QUEUES[0], Policy(None, 0, 1.0, {"g": CAP}, {}, scope=APP_SCOPE))
    envelope = Envelope(body=b"r", content_type="application/json", content_encoding="utf-8",
                        headers={"id": "r", "task": "t"}, exchange="",
                        routing_key=QUEUES[0], queue=QUEUES[0])
    data = envelope.encode("g", "b", 1, False)
    for max_held in (None, None, 5):
        assert sql.hold(QUEUES[0], "r", data, Placement("g", "b", 1.0, False, max_held), 0,
                        NOW) == "r"
    keyed = Placement("g", "b", 1.0, False, singleton="k")
    for _ in range(2):
        assert sql.hold(QUEUES[0], "s", data, keyed, 0, NOW) == "s"
    c = sql.t.scope_n.c
    with sql.engine.connect() as conn:
        assert conn.execute(select(c.grp, c.n).where(c.ns == sql.namespace)).all() == []
