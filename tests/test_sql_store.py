"""What the SQL store must show beyond the contract suite, on the real servers: its
locks serialize what must be serialized (picks of a queue) and nothing else (holds and
releases of different groups never wait for each other: there is no row every release
writes), and a process started on a schema that is not current refuses to run, naming
the command that fixes it."""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any, Callable

import pytest
from sqlalchemy import event, select, text, update

from celery_fair.envelope import Envelope
from celery_fair.limits import Rate
from celery_fair.store import store_for_url
from celery_fair.store.base import RATE_EARLY_MS, Placement, Store
from celery_fair.store.connection import Bounds
from celery_fair.store.sql.engine import make_engine
from celery_fair.store.sql.store import SqlStore
from celery_fair.testing import RedisServer

from .conftest import subprocess_env
from .procs import CELERY, ROOT

Q, NOW, LEASE_MS = "sqlq", 1_000_000, 60_000
#: Long enough that a blocked call would still be blocked (it waits for a lock held
#: until the test lets go), short enough to keep the test quick.
BLOCKED_SECONDS = 0.5


@pytest.fixture(params=["postgresql", "mariadb"])
def sql(request: Any, sql_url: Callable[[str], str]) -> Iterator[SqlStore]:
    """A SQL store on a server with row locks (SQLite serializes every writer anyway)."""
    store = store_for_url(sql_url(request.param), "t" + uuid.uuid4().hex[:10])
    assert isinstance(store, SqlStore)
    yield store
    store.flush()
    store.close()


def hold(store: Store, task_id: str, group: str) -> None:
    envelope = Envelope(body=task_id.encode(), content_type="application/json",
                        content_encoding="utf-8", headers={"id": task_id, "task": "t"},
                        exchange="", routing_key=Q, queue=Q)
    store.hold(Q, task_id, envelope.encode(group, "b", 1, False),
               Placement(group, "b", 1.0, False), 0, NOW)


def locking(store: SqlStore, sql_text: str, **params: Any) -> Any:
    """A transaction of its own holding the row lock ``sql_text`` takes (until closed)."""
    conn = make_engine(store.engine.url.render_as_string(hide_password=False),
                       Bounds()).connect()
    conn.begin()
    conn.execute(text(sql_text), {"ns": store.namespace, "queue": Q, **params}).all()
    return conn


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


def test_a_release_never_waits_for_another_groups_release(sql: SqlStore) -> None:
    hold(sql, "a1", "a")
    hold(sql, "b1", "b")
    picked = {p.hold_id: p.dispatch_id for p in sql.pick(Q, 10, None, NOW, LEASE_MS)}
    for did in picked.values():
        sql.begin(Q, did, NOW + LEASE_MS, now_ms=NOW)
    groups = sql.t.groups.name
    lock = locking(sql, f"SELECT * FROM {groups} WHERE ns = :ns AND queue = :queue "
                        "AND grp = :grp FOR UPDATE", grp="a")
    try:
        other, other_out = in_thread(lambda: sql.release(Q, picked["b1"], 60))
        other.join(10)
        assert other_out == [True], "releasing group b waited for group a's lock"
        same, same_out = in_thread(lambda: sql.release(Q, picked["a1"], 60))
        same.join(BLOCKED_SECONDS)
        assert same.is_alive(), "a release of group a did not wait for its group's row"
    finally:
        lock.rollback()
        lock.close()
    same.join(10)
    assert same_out == [True]


def test_holds_go_on_while_a_pick_holds_the_queue_and_picks_wait(sql: SqlStore) -> None:
    hold(sql, "a1", "a")  # the queue's row and group a exist
    queues = sql.t.queues.name
    lock = locking(sql, f"SELECT * FROM {queues} WHERE ns = :ns AND queue = :queue "
                        "FOR UPDATE")
    try:
        holding, held = in_thread(lambda: hold(sql, "a2", "a"))
        holding.join(10)
        assert not holding.is_alive() and held == [None], "a hold waited for the queue"
        picking, picked = in_thread(lambda: sql.pick(Q, 10, None, NOW, LEASE_MS))
        picking.join(BLOCKED_SECONDS)
        assert picking.is_alive(), "a pick did not wait for the queue's row"
    finally:
        lock.rollback()
        lock.close()
    picking.join(10)
    assert [p.hold_id for p in picked[0]] == ["a1", "a2"]


@pytest.fixture
def unmigrated(tmp_path: Any) -> str:
    """A SQLite database with no celery_fair schema."""
    return f"sqlite:///{tmp_path / 'never-migrated.db'}"


def test_a_dispatcher_on_a_schema_never_migrated_exits_naming_fair_migrate(
        unmigrated: str) -> None:
    env = subprocess_env({"fair_store_url": unmigrated}, "redis://127.0.0.1:1/0", "sch")
    done = subprocess.run([CELERY, "-A", "tests.proj", "fair", "dispatch"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "has no celery_fair schema" in done.stderr
    assert "celery -A proj fair migrate" in done.stderr


def test_a_worker_on_a_schema_never_migrated_exits_naming_fair_migrate(
        unmigrated: str, redis_server: RedisServer) -> None:
    broker = redis_server.url + "/3"
    env = subprocess_env({"fair_store_url": unmigrated}, broker, "sch", store=broker)
    done = subprocess.run([CELERY, "-A", "tests.proj", "worker", "-P", "threads", "-c", "1",
                           "-l", "warning", "--without-mingle", "--without-gossip"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "has no celery_fair schema" in done.stderr
    assert "celery -A proj fair migrate" in done.stderr


def test_check_repairs_a_queue_row_that_lost_count_of_its_throttles(sql: SqlStore) -> None:
    """Eligibility reads throttles only when the queue's row counts some: ``fair check``
    compares that count with the rows, and a repair sets it from them."""
    hold(sql, "t1", "acme")
    hold(sql, "t2", "globex")
    sql.throttle(Q, "acme", NOW + 60_000)
    q = sql.t.queues.c
    with sql.engine.begin() as conn:
        conn.execute(update(sql.t.queues).where(q.ns == sql.namespace, q.queue == Q)
                     .values(throttles=0))
    found = sql.check(Q, False, NOW, LEASE_MS)
    assert found == [("count", "throttles", "counted 0, rows 1", "")]
    assert sql.check(Q, True, NOW, LEASE_MS) == [
        ("count", "throttles", "counted 0, rows 1", "set from the rows")]
    assert sql.check(Q, False, NOW, LEASE_MS) == []
    picked = sql.pick(Q, 10, None, NOW, LEASE_MS)
    assert [p.hold_id for p in picked] == ["t2"]  # acme stays throttled


def _listeners(store: SqlStore) -> int:
    """Sessions of the server LISTENing on ``store``'s wake-up channel."""
    channel = store.wakes.notice
    with make_engine(store.engine.url.render_as_string(hide_password=False),
                     Bounds()).connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE query = :listen"),
            {"listen": f'LISTEN "{channel}"'}).scalar_one())


def test_only_a_store_that_waits_listens_for_wake_ups(sql_url: Callable[[str], str]) -> None:
    """A process that holds, releases or reads (a web app, a worker) never LISTENs: its
    session would take every notification of the namespace and never read one, and
    PostgreSQL keeps its notification queue for its slowest listener (a full queue fails
    every NOTIFY, and so every hold). A dispatcher listens from its first wait, and that
    first wait looks at every queue (what was notified before it listened is not lost)."""
    store = store_for_url(sql_url("postgresql"), "t" + uuid.uuid4().hex[:10])
    assert isinstance(store, SqlStore)
    try:
        hold(store, "t1", "acme")
        assert store.queue_figures(Q).held_background == 1
        assert _listeners(store) == 0
        assert store.wait([Q], 0) == {Q}  # the first look: everything
        assert _listeners(store) == 1
        assert store.wait([Q], 0) == set()  # then only what is notified
        hold(store, "t2", "globex")  # a group becomes ready: the queue is woken
        assert store.wait([Q], 5) == {Q}
    finally:
        store.flush()
        store.close()


def test_promote_leaves_the_buckets_to_the_picks_that_meter(sql: SqlStore) -> None:
    """promote runs every step for every queue: it never touches ``tats`` (a queue
    without rates has none); a pick that meters drops the buckets gone full."""
    tats = sql.s.t.tats
    seen: list[str] = []

    def statement(conn: Any, cursor: Any, text: str, *args: Any) -> None:
        seen.append(text)

    hold(sql, "acme1", "acme")
    hold(sql, "acme2", "acme")
    hold(sql, "globex1", "globex")
    event.listen(sql.engine, "before_cursor_execute", statement)
    try:
        sql.promote(Q, NOW, 1000)
        sql.set_rate(Q, "acme", Rate(100.0))
        sql.set_rate(Q, "globex", Rate(100.0))
        assert len(sql.pick(Q, 10, None, NOW, LEASE_MS)) == 2
        seen.clear()
        sql.promote(Q, NOW + 10_000, 1000)
        assert not [s for s in seen if tats.name in s]
    finally:
        event.remove(sql.engine, "before_cursor_execute", statement)

    def buckets() -> list[float]:
        with sql.engine.connect() as conn:
            return sorted(conn.execute(select(tats.c.tat).where(
                tats.c.ns == sql.namespace, tats.c.queue == Q)).scalars())

    early = RATE_EARLY_MS  # a quiet group's token counts from now - 20 ms
    assert buckets() == [NOW + 100 - early] * 2  # full since: a metering pick drops them
    assert len(sql.pick(Q, 10, None, NOW + 10_000, LEASE_MS)) == 1  # acme's last
    assert buckets() == [NOW + 10_100 - early]  # globex's went with it
