"""The SQL store's schema migrations (``fair migrate``) on real databases: SQLite (a
file), PostgreSQL and MariaDB, each in a database of its own made for this module."""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result
from sqlalchemy import Column, Engine, Integer, column, table, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from celery_fair.cli import fair
from celery_fair.config import get_config
from celery_fair.errors import ConfigurationError, SchemaOutOfDate
from celery_fair.store.base import Placement, Policy
from celery_fair.store.sql import (
    SCHEMA_VERSION,
    Bounds,
    check_schema,
    make_engine,
    migrate,
    schema_revision,
    upgrade_sql,
)
from celery_fair.store.sql.schema import Tables

from .components import MARIADB, POSTGRESQL, require_component
from .conftest import subprocess_env
from .procs import CELERY, ROOT

#: A server's administrative URL: the module's database is made and dropped through it.
SERVERS = {"postgresql": "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
           "mariadb": "mysql+pymysql://root@127.0.0.1:3306/mysql"}


def _server_database(backend: str) -> Iterator[str]:
    admin_url = SERVERS[backend]
    admin = make_engine(admin_url, Bounds(connect_timeout=3.0))
    name = f"celery_fair_mig_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                f"CREATE DATABASE {name}")
    except OperationalError as exc:
        admin.dispose()
        server = POSTGRESQL if backend == "postgresql" else MARIADB
        require_component(server.name, server.how_to_install,
                          f"not reachable at {make_url(admin_url)!r}: {exc.orig}")
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                f"DROP DATABASE {name}")
        admin.dispose()


@pytest.fixture(scope="module", params=["sqlite", "postgresql", "mariadb"])
def database(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh database of each backend, shared by the module's tests (each test uses
    table prefixes of its own)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('migrate') / 'fair.db'}"
    else:
        yield from _server_database(request.param)


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}_"


@pytest.fixture
def engine(database: str) -> Iterator[Engine]:
    engine = make_engine(database, Bounds())
    yield engine
    engine.dispose()


def schema_differences(engine: Engine, tables: Tables) -> list[Any]:
    """What Alembic finds different between the database's tables of ``tables.prefix``
    (its version table aside) and ``tables.metadata``."""
    def ours(name: Any, kind: str, parent: Any) -> bool:
        return kind != "table" or (name.startswith(tables.prefix)
                                   and name != f"{tables.prefix}alembic_version")

    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"include_name": ours})
        return list(compare_metadata(context, tables.metadata))


def app_for(url: str, **conf: Any) -> Celery:
    app = Celery("proj", set_as_current=False)
    app.conf.update(fair_store_url=url, **conf)
    return app


def fair_migrate(app: Celery, *args: str) -> Result:
    obj = CLIContext(app=app, no_color=True, workdir=None)
    return CliRunner().invoke(fair, ["migrate", *args], obj=obj, catch_exceptions=False)


# -- migrate ------------------------------------------------------------------------------

def test_migrate_from_empty_creates_the_schema_of_the_code(database: str, engine: Engine,
                                                           prefix: str) -> None:
    assert schema_revision(engine, prefix) is None
    assert migrate(database, prefix) == (None, SCHEMA_VERSION)
    assert schema_revision(engine, prefix) == SCHEMA_VERSION
    assert schema_differences(engine, Tables(prefix)) == []
    check_schema(engine, prefix, "test")  # current: no error


def test_the_schema_comparison_sees_a_difference(database: str, engine: Engine,
                                                 prefix: str) -> None:
    # The test above passes only if the comparison can fail: a column the tables lack.
    migrate(database, prefix)
    tables = Tables(prefix)
    tables.queues.append_column(Column("extra", Integer))
    assert [d[0] for d in schema_differences(engine, tables)] == ["add_column"]


def test_two_prefixes_live_side_by_side_in_one_database(database: str, engine: Engine,
                                                        prefix: str) -> None:
    other = "o" + prefix
    assert migrate(database, prefix) == (None, SCHEMA_VERSION)
    assert schema_revision(engine, other) is None  # its own version table
    assert migrate(database, other) == (None, SCHEMA_VERSION)
    for each in (prefix, other):
        assert schema_differences(engine, Tables(each)) == []
        assert schema_revision(engine, each) == SCHEMA_VERSION


def test_migrating_again_changes_nothing_and_keeps_the_rows(database: str, engine: Engine,
                                                            prefix: str) -> None:
    migrate(database, prefix)
    with engine.begin() as conn:
        conn.execute(Tables(prefix).workers.insert().values(
            ns="n", queue="q", worker="w1", concurrency=4, expires_ms=1))
    assert migrate(database, prefix) == (SCHEMA_VERSION, SCHEMA_VERSION)
    with engine.connect() as conn:
        workers = Tables(prefix).workers
        assert conn.execute(workers.select()).all() == [("n", "q", "w1", 4, 1, None, None)]


def test_a_0009_worker_upgraded_has_no_slot_until_it_registers_again(
        database: str, engine: Engine, prefix: str) -> None:
    """Revision 0010 (worker slots) leaves a worker registered before it without a start
    time or slot (an old worker still running); its next registration takes both."""
    from alembic import command

    from celery_fair.store.models import LiveWorker
    from celery_fair.store.sql.migrate import alembic_config
    from celery_fair.store.sql.store import SqlStore

    with engine.connect() as conn:
        command.upgrade(alembic_config(prefix, connection=conn), "0009")
        row = dict(ns="n", queue="q", worker="w1", concurrency=4, expires_ms=10_000)
        conn.execute(table(prefix + "workers", *map(column, row)).insert().values(row))
        conn.commit()
    assert migrate(database, prefix) == ("0009", SCHEMA_VERSION)
    store = SqlStore(engine, "n", prefix)
    assert store.live_workers("q", 5_000) == [LiveWorker("w1", 4, None, None)]
    store.register_worker("q", "w2", 2, 20_000, 5_000)
    store.register_worker("q", "w1", 4, 20_000, 6_000)
    assert store.live_workers("q", 6_000) == [LiveWorker("w2", 2, 5_000, 0),
                                              LiveWorker("w1", 4, 6_000, 1)]


def test_a_0001_schema_is_refused_until_upgraded_keeping_its_rows(
        database: str, engine: Engine, prefix: str) -> None:
    """A database migrated before the dispatchers' heartbeats (revision 0001) is refused
    until ``fair migrate``, which adds their table and keeps what was there."""
    from alembic import command

    from celery_fair.store.sql.migrate import alembic_config

    with engine.connect() as conn:
        command.upgrade(alembic_config(prefix, connection=conn), "0001")
        conn.execute(Tables(prefix).workers.insert().values(
            ns="n", queue="q", worker="w1", concurrency=4, expires_ms=1))
        conn.commit()
    with pytest.raises(SchemaOutOfDate, match="fair migrate"):
        check_schema(engine, prefix, "test")
    assert migrate(database, prefix) == ("0001", SCHEMA_VERSION)
    assert schema_differences(engine, Tables(prefix)) == []
    with engine.connect() as conn:
        assert conn.execute(Tables(prefix).workers.select()).all() == [
            ("n", "q", "w1", 4, 1, None, None)]


def test_a_0004_queue_upgraded_has_no_throttles_and_no_default_rate(
        database: str, engine: Engine, prefix: str) -> None:
    """Revision 0005 (rate limits) counts no throttles for a queue made before it: a
    count it filled with NULL would break every pick of that queue."""
    from alembic import command

    from celery_fair.store.sql.migrate import alembic_config

    with engine.connect() as conn:
        command.upgrade(alembic_config(prefix, connection=conn), "0004")
        conn.execute(text(
            f"INSERT INTO {prefix}queues (ns, queue, registered, default_cap, reserve, "
            "default_weight, picks, dups, pauses) VALUES ('n', 'q', :yes, -1, 0, 1.0, 7, 0, 0)"),
            {"yes": True})
        conn.commit()
    assert migrate(database, prefix) == ("0004", SCHEMA_VERSION)
    assert schema_differences(engine, Tables(prefix)) == []
    q = Tables(prefix).queues.c
    with engine.connect() as conn:
        assert conn.execute(Tables(prefix).queues.select().with_only_columns(
            q.picks, q.throttles, q.default_rate)).all() == [(7, 0, None)]


def test_a_0005_group_upgraded_has_no_head_time_and_waits_from_its_due_time(
        database: str, engine: Engine, prefix: str) -> None:
    """Revision 0006 (head times) leaves a group held before it without one: its head's
    wait counts from the head's due time until its head next changes."""
    from alembic import command

    from celery_fair.envelope import Envelope
    from celery_fair.store.heads import head_wait
    from celery_fair.store.sql.migrate import alembic_config
    from celery_fair.store.sql.store import SqlStore

    value = Envelope(body=b"{}", content_type="application/json", content_encoding="utf-8",
                     headers={"id": "t1", "task": "t"}, exchange="", routing_key="q",
                     queue="q", due_at=1000.0).encode("acme", "b", 1.0, False)
    with engine.connect() as conn:
        command.upgrade(alembic_config(prefix, connection=conn), "0005")
        rows = {"groups": dict(ns="n", queue="q", grp="acme", inflight=0, delayed=0,
                               held_i=0, held_b=1, head=0, tail=2),  # the 0005 columns
                "messages": dict(ns="n", queue="q", hold_id="t1", task_id="t1", grp="acme",
                                 klass="b", cost=1.0, front=False, seq=1, value=value)}
        for name, row in rows.items():
            conn.execute(table(prefix + name, *map(column, row)).insert().values(row))
        conn.commit()
    assert migrate(database, prefix) == ("0005", SCHEMA_VERSION)
    store = SqlStore(engine, "n", prefix)
    [heads] = store.summarize("q", ["acme"])
    assert (heads.due_background, heads.since_background) == (1000.0, None)
    assert head_wait(heads, 1060.0) == 60.0
    store.hold("q", "t2", value, Placement("acme", "b", 1.0, True), 0, 1_050_000)  # front
    [heads] = store.summarize("q", ["acme"])
    assert heads.since_background == 1050.0 and head_wait(heads, 1060.0) == 10.0


def test_0014_singleton_rows_upgraded_span_the_app(database: str, engine: Engine,
                                                   prefix: str) -> None:
    """Revision 0015: a key's owner and waiting list become the namespace's, naming their
    queue; a key owned in two queues keeps the first queue's owner, the lists join."""
    from alembic import command

    from celery_fair.store.sql.migrate import alembic_config

    with engine.connect() as conn:
        command.upgrade(alembic_config(prefix, connection=conn), "0014")
        owners = table(prefix + "sowners", *map(column, ("ns", "queue", "skey", "owner")))
        waits = table(prefix + "swaits",
                      *map(column, ("ns", "queue", "skey", "pos", "hold_id")))
        conn.execute(owners.insert().values([
            dict(ns="n", queue="q1", skey="x", owner="hk1"),
            dict(ns="n", queue="q2", skey="x", owner="dD9")]))
        conn.execute(waits.insert().values([
            dict(ns="n", queue="q1", skey="x", pos=0, hold_id="k2"),
            dict(ns="n", queue="q2", skey="x", pos=-1, hold_id="k3")]))
        conn.commit()
    assert migrate(database, prefix) == ("0014", SCHEMA_VERSION)
    with engine.connect() as conn:
        assert [tuple(r) for r in conn.execute(text(
            f"SELECT ns, queue, skey, owner, oqueue FROM {prefix}sowners"))] \
            == [("n", "", "x", "hk1", "q1")]
        assert [tuple(r) for r in conn.execute(text(
            f"SELECT queue, pos, hold_id, wqueue FROM {prefix}swaits ORDER BY pos"))] \
            == [("", 0, "k2", "q1"), ("", 1, "k3", "q2")]


def test_a_0015_queue_upgraded_is_queue_scoped_then_app_scoped_counts_its_flight(
        database: str, engine: Engine, prefix: str) -> None:
    """Revision 0016 (fair_scope 'app'): a queue made before it keeps scope 'queue' (no
    app-wide count); configured 'app', its groups' dispatches in flight count app-wide."""
    from alembic import command

    from celery_fair.limits import APP_SCOPE
    from celery_fair.store.sql.migrate import alembic_config
    from celery_fair.store.sql.store import SqlStore

    with engine.connect() as conn:
        command.upgrade(alembic_config(prefix, connection=conn), "0015")
        rows = {"queues": dict(ns="n", queue="q", registered=True, default_cap=-1,
                               reserve=0, default_weight=1.0, picks=1, dups=0, pauses=0),
                "groups": dict(ns="n", queue="q", grp="acme", inflight=2, delayed=0,
                               held_i=0, held_b=0, head=0, tail=1)}
        for name, row in rows.items():
            conn.execute(table(prefix + name, *map(column, row)).insert().values(row))
        conn.commit()
    assert migrate(database, prefix) == ("0015", SCHEMA_VERSION)
    assert schema_differences(engine, Tables(prefix)) == []
    t = Tables(prefix)
    with engine.connect() as conn:
        assert conn.execute(t.queues.select().with_only_columns(t.queues.c.scope)
                            ).all() == [(None,)]
        assert conn.execute(t.scope_n.select()).all() == []
    SqlStore(engine, "n", prefix).configure("q", Policy(None, 0, 1.0, {}, {},
                                                        scope=APP_SCOPE))
    with engine.connect() as conn:
        assert conn.execute(t.scope_n.select()).all() == [("n", "acme", 2)]


def test_0016_rows_upgraded_take_caps_per_subgroup(database: str, engine: Engine,
                                                   prefix: str) -> None:
    """Revision 0017 (caps per subgroup): a group held before it parks nothing and counts
    nothing parked; under a cap on a path its work is parked and unparked as any."""
    from alembic import command

    from celery_fair.store.sql.migrate import alembic_config
    from celery_fair.store.sql.store import SqlStore

    from .store_helpers import LEASE, NOW, Q
    from .test_store_contract_subgroup import value

    with engine.connect() as conn:
        command.upgrade(alembic_config(prefix, connection=conn), "0016")
        conn.execute(table(prefix + "groups", *map(column, (
            "ns", "queue", "grp", "inflight", "delayed", "held_i", "held_b", "head",
            "tail"))).insert().values(ns="n", queue=Q, grp="acme", inflight=0, delayed=0,
                                      held_i=0, held_b=2, head=0, tail=3))
        conn.execute(table(prefix + "ready", *map(column, (
            "ns", "queue", "klass", "grp", "tag"))).insert().values(
            ns="n", queue=Q, klass="b", grp="acme", tag=0.0))
        messages = table(prefix + "messages", *map(column, (
            "ns", "queue", "hold_id", "task_id", "grp", "klass", "cost", "front", "seq",
            "value")))
        conn.execute(messages.insert().values([
            dict(ns="n", queue=Q, hold_id=f"a{k}", task_id=f"a{k}", grp="acme", klass="b",
                 cost=1.0, front=False, seq=k + 1,
                 value=value("acme", "alice", f"a{k}", 1, False)) for k in range(2)]))
        conn.commit()
    assert migrate(database, prefix) == ("0016", SCHEMA_VERSION)
    store = SqlStore(engine, "n", prefix)
    assert store.check(Q, False, NOW, LEASE) == []
    store.configure(Q, Policy(None, 0, 1.0, {"acme/alice": 1}, {}, subgroup="path"))
    [first] = store.pick(Q, 5, None, NOW, LEASE)  # a1 parked behind it
    assert first.hold_id == "a0"
    assert store.group_figures(Q, ["acme"])[0].held_background == 1
    assert store.check(Q, False, NOW, LEASE) == []
    assert store.release(Q, first.dispatch_id, now_ms=NOW)
    assert [p.hold_id for p in store.pick(Q, 5, None, NOW, LEASE)] == ["a1"]


def test_two_processes_migrating_at_once_both_succeed(database: str, engine: Engine,
                                                      prefix: str) -> None:
    results: list[tuple[str | None, str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(migrate(database, prefix))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert sorted(results, key=lambda r: r[0] is not None) == [(None, SCHEMA_VERSION),
                                                                (SCHEMA_VERSION, SCHEMA_VERSION)]
    assert schema_differences(engine, Tables(prefix)) == []


def test_a_bad_table_prefix_is_refused_naming_it(database: str) -> None:
    with pytest.raises(ConfigurationError, match="table_prefix='x; drop'.*letters"):
        migrate(database, "x; drop")


# -- check_schema -------------------------------------------------------------------------

def test_check_schema_names_the_command_when_the_schema_is_missing(
        database: str, engine: Engine, prefix: str) -> None:
    with pytest.raises(SchemaOutOfDate) as info:
        check_schema(engine, prefix, "dispatcher")
    message = str(info.value)
    assert message.startswith("dispatcher: ")
    assert "has no celery_fair schema" in message and repr(prefix) in message
    assert f"expects revision {SCHEMA_VERSION}" in message
    assert "celery -A proj fair migrate" in message
    assert make_url(database).database.split("/")[-1] in message  # names the database


def test_check_schema_names_the_command_when_the_revision_is_another(
        database: str, engine: Engine, prefix: str) -> None:
    migrate(database, prefix)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {prefix}alembic_version SET version_num = '9999'"))
    with pytest.raises(SchemaOutOfDate) as info:
        check_schema(engine, prefix, "worker")
    message = str(info.value)
    assert "revision 9999" in message and f"expects revision {SCHEMA_VERSION}" in message
    assert "celery -A proj fair migrate" in message
    assert "a newer celery_fair migrated it" in message  # 9999 is no revision of ours


def test_check_schema_shows_the_database_without_its_password(prefix: str) -> None:
    # PostgreSQL's trust authentication ignores the password: the URL carries one anyway.
    engine = make_engine(SERVERS["postgresql"].replace("postgres@", "postgres:s3cret@"),
                         Bounds(connect_timeout=3.0))
    try:
        with pytest.raises(SchemaOutOfDate) as info:
            check_schema(engine, prefix, "dispatcher")
    except OperationalError as exc:
        require_component(POSTGRESQL.name, POSTGRESQL.how_to_install,
                          f"not reachable: {exc.orig}")
    finally:
        engine.dispose()
    message = str(info.value)
    assert "s3cret" not in message
    assert "postgresql+psycopg://postgres:**@127.0.0.1:5432/postgres" in message


# -- the command --------------------------------------------------------------------------

def test_fair_migrate_check_exits_1_until_migrated_then_0(database: str, prefix: str) -> None:
    app = app_for(database, fair_store_table_prefix=prefix)
    missing = fair_migrate(app, "--check")
    assert missing.exit_code == 1
    assert "celery -A proj fair migrate" in missing.output

    done = fair_migrate(app)
    assert done.exit_code == 0, done.output
    assert done.output.startswith("migrated ") and f"(prefix {prefix}): none -> " \
        f"{SCHEMA_VERSION}" in done.output

    current = fair_migrate(app, "--check")
    assert current.exit_code == 0, current.output
    assert f"is current: revision {SCHEMA_VERSION}" in current.output
    again = fair_migrate(app)
    assert f"{SCHEMA_VERSION} -> {SCHEMA_VERSION} (already current)" in again.output


def test_fair_migrate_sql_prints_the_ddl_and_changes_nothing(database: str, engine: Engine,
                                                            prefix: str) -> None:
    result = fair_migrate(app_for(database, fair_store_table_prefix=prefix), "--sql")
    assert result.exit_code == 0, result.output
    assert f"CREATE TABLE {prefix}queues" in result.output
    assert f"CREATE TABLE {prefix}alembic_version" in result.output
    assert schema_revision(engine, prefix) is None
    assert result.output == upgrade_sql(database, prefix)


def test_fair_migrate_as_a_celery_process(database: str, engine: Engine, prefix: str) -> None:
    env = subprocess_env({"fair_store_url": database, "fair_store_table_prefix": prefix},
                         "redis://127.0.0.1:1/0", "mig")
    done = subprocess.run([CELERY, "-A", "tests.proj", "fair", "migrate"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"none -> {SCHEMA_VERSION}" in done.stdout
    assert schema_revision(engine, prefix) == SCHEMA_VERSION


def test_fair_migrate_on_a_redis_store_has_nothing_to_do() -> None:
    result = fair_migrate(app_for("redis://:secret@127.0.0.1:1/0"))
    assert result.exit_code == 0
    assert "nothing to migrate" in result.output and "Redis" in result.output
    assert "secret" not in result.output


def test_fair_migrate_with_a_bad_prefix_names_the_setting(tmp_path: Path) -> None:
    app = app_for(f"sqlite:///{tmp_path / 'fair.db'}", fair_store_table_prefix="1abc")
    result = fair_migrate(app)
    assert result.exit_code == 1
    assert "fair_store_table_prefix='1abc'" in result.output
    assert not (tmp_path / "fair.db").exists()


def test_the_table_prefix_setting_defaults_to_fair_and_is_limited_to_20_characters() -> None:
    assert get_config(app_for("sqlite:///x.db")).store_table_prefix == "fair_"
    assert get_config(app_for("sqlite:///x.db", fair_store_table_prefix="a" * 20)) \
        .store_table_prefix == "a" * 20
    with pytest.raises(ConfigurationError, match="fair_store_table_prefix.*at most 20"):
        get_config(app_for("sqlite:///x.db", fair_store_table_prefix="a" * 21))
