"""``celery -A proj fair status|groups|limit|inspect`` against a real store: through
click's CliRunner for the details, and once per command as a real ``celery`` process."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
from typing import Any, Callable

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_fair.cli import fair
from celery_fair.dispatcher import Dispatcher
from celery_fair.redact import safe_url
from celery_fair.store.base import as_json
from celery_fair.summary import read_summaries
from celery_fair.task import store_for
from celery_fair.testing import RedisServer, free_port

from .conftest import subprocess_env, wait_for
from .helpers import queue_of, settled
from .procs import CELERY, ROOT, CeleryProcess


@pytest.fixture
def cli(app: Any) -> Callable[..., Result]:
    def run(*args: str, the_app: Any = None) -> Result:
        obj = CLIContext(app=the_app or app, no_color=True, workdir=None)
        return CliRunner().invoke(fair, list(args), obj=obj, catch_exceptions=False)

    return run


def fill(app: Any) -> dict[str, list[str]]:
    """acme 3 background, globex 2, initech 1 interactive; returns their task ids."""
    work, preview = app.tasks["proj.work"], app.tasks["proj.preview"]
    ids: dict[str, list[str]] = {}
    for tenant, count in (("acme", 3), ("globex", 2)):
        ids[tenant] = [work.delay(tenant, f"{tenant}-{i}").id for i in range(count)]
    ids["initech"] = [preview.delay("initech", "p").id]
    return ids


def run_celery(app: Any, namespace: str, redis_url: str, *args: str,
               conf: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(conf or {}, redis_url + "/0", namespace)
    return subprocess.run([CELERY, "-A", "tests.proj", "fair", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


# -- status --------------------------------------------------------------------------------

def test_status_shows_totals_and_busiest_groups(app, cli) -> None:
    fill(app)
    queue = queue_of(app)
    out = cli("status").output
    lines = [line.split() for line in out.splitlines()]
    # held, interactive, delayed, in flight, capacity, ahead, oldest wait (2), groups,
    # released, policy
    assert [queue, "6", "1", "0", "0", "0", "0"] == lines[2][:7]
    assert lines[2][-3:] == ["3", "0", "wfq"]
    assert f"queue {queue}: busiest groups" in out
    assert ["acme", "3", "0", "0", "0", "-", "1"] in [r[:7] for r in lines]
    assert ["initech", "0", "1", "0", "0", "-", "1"] in [r[:7] for r in lines]
    assert "... and 2 more groups" in cli("status", "--top", "1").output

    data = json.loads(cli("status", "--json").output)
    [q] = data["queues"]
    assert (q["queue"], q["held_background"], q["held_interactive"]) == (queue, 5, 1)
    assert [g["group"] for g in q["groups"]] == ["acme", "globex", "initech"]
    assert [{k: v for k, v in g.items() if k not in ("oldest_wait", "head_wait")}
            for g in q["groups"]] == \
        [as_json(r) for r in store_for(app).group_figures(queue, ["acme", "globex", "initech"])]


def test_status_totals_are_exact_with_more_groups_than_shown(app, cli) -> None:
    """--top bounds the groups read, not the totals: they are the store's counters."""
    fill(app)
    app.tasks["proj.work"].apply_async(("umbrella", "later"), countdown=60)
    store, queue = store_for(app), queue_of(app)
    store.pick(queue, 1, None, int(time.time() * 1000), 10_000)  # initech: in flight
    [q] = json.loads(cli("status", "--json", "--top", "1").output)["queues"]
    snap = store.snapshot(queue)
    assert [g["group"] for g in q["groups"]] == ["acme"]
    assert (q["held_interactive"], q["held_background"], q["delayed"], q["inflight"]) == \
        (snap["held_interactive"], snap["held_background"], snap["delayed"],
         snap["inflight"]) == (0, 5, 1, 1)
    assert q["group_count"] == len(snap["groups"]) == 4
    assert q["more_groups"] == 3


def test_status_shows_in_flight_against_capacity_plus_dispatch_ahead(app, cli) -> None:
    """Dispatch-ahead lets a queue have more in flight than its workers' pools: status
    shows the pools and the ahead allowance apart, so 6 in flight with 4 slots is not a
    broken cap."""
    fill(app)
    store, queue = store_for(app), queue_of(app)
    now = int(time.time() * 1000)
    store.register_worker(queue, "w1", 4, now + 60_000, now)
    assert len(store.pick(queue, 6, None, now, 10_000)) == 6  # 4 slots + 2 ahead
    [q] = json.loads(cli("status", "--json").output)["queues"]
    assert (q["inflight"], q["capacity"], q["dispatch_ahead"], q["inflight_limit"]) == \
        (6, 4, 2, 6)


def test_status_with_a_fixed_max_inflight_shows_no_ahead(make_app, cli) -> None:
    app = make_app(fair_max_inflight=5)
    fill(app)
    [q] = json.loads(cli("status", "--json", the_app=app).output)["queues"]
    assert (q["capacity"], q["dispatch_ahead"], q["inflight_limit"]) == (5, 0, 5)
    [row] = [line.split() for line in cli("status", the_app=app).output.splitlines()
             if line.startswith(q["queue"])]
    assert row[4:7] == ["0", "5", "0"]  # in flight, capacity, ahead


def test_status_bad_options_name_the_option(cli) -> None:
    result = cli("status", "--top", "-3")
    assert result.exit_code == 2 and "'--top'" in result.output
    result = cli("status", "--watch", "0")
    assert result.exit_code == 2 and "'--watch'" in result.output


def test_status_watch_refreshes_until_interrupted(app, redis_server, namespace,
                                                  tmp_path) -> None:
    fill(app)
    proc = CeleryProcess(["fair", "status", "--json", "--watch", "0.2"], {},
                         redis_server.url + "/0", namespace, tmp_path / "watch.log")
    try:
        def documents() -> list[Any]:
            assert proc.alive(), proc.output()
            text = proc.log_path.read_text()
            return [json.loads(line) for line in text.splitlines()[:-1]
                    if line.startswith("{")]

        first, second = wait_for(lambda: len(documents()) >= 2 and documents(),
                                 what="two refreshes")[:2]
        app.tasks["proj.work"].delay("acme", "more")
        wait_for(lambda: documents()[-1]["queues"][0]["held_background"] == 6,
                 what="a refresh showing the new task")
        assert first["queues"][0]["held_background"] == 5
        proc.proc.send_signal(signal.SIGINT)
        try:
            code = proc.proc.wait(60)  # a loaded CI machine: seen > 10 s once
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit 60 s after SIGINT; its threads:\n{proc.stacks()}")
        assert code == 0, proc.output()
    finally:
        proc.stop()


# -- dispatch: the store at start ----------------------------------------------------------

def test_dispatch_exits_at_once_naming_an_unreachable_store(redis_server, namespace) -> None:
    """A wrong store URL fails fast, with the URL (password masked) and what to do."""
    store = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    env = subprocess_env({}, redis_server.url + "/0", namespace, store)
    started = time.monotonic()
    done = subprocess.run([CELERY, "-A", "tests.proj", "fair", "dispatch"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert took < 20, took  # the process's own start-up, no retrying
    assert safe_url(store) in out, out  # masked as Celery masks it (redact.safe_url)
    assert "s3cret" not in out, out
    assert "cannot reach the celery_fair store" in out and "--wait-for-store" in out, out


def test_dispatch_names_the_database_not_redis_for_an_unreachable_sql_store(
        redis_server, namespace) -> None:
    store = f"postgresql+psycopg://postgres:s3cret@127.0.0.1:{free_port()}/fair"
    env = subprocess_env({"fair_store_url": store}, redis_server.url + "/0", namespace)
    done = subprocess.run([CELERY, "-A", "tests.proj", "fair", "dispatch"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "cannot reach the celery_fair store" in out and "s3cret" not in out, out
    assert "start the database there" in out and "Redis" not in out, out


def test_dispatch_waits_for_the_store_when_asked(redis_server, namespace, tmp_path) -> None:
    """--wait-for-store: a store that comes up within the time is served."""
    store = RedisServer()
    store.halt()  # its port is known and nothing answers there
    proc = CeleryProcess(["fair", "dispatch", "--wait-for-store", "60"], {},
                         redis_server.url + "/0", namespace, tmp_path / "dispatch.log",
                         store=store.url + "/0")
    try:
        wait_for(lambda: "waiting up to" in proc.output(), timeout=30,
                 what="the dispatcher to say it waits for the store")
        assert proc.alive(), proc.output()
        store.start()
        wait_for(lambda: "dispatcher started" in proc.output(), timeout=30,
                 what="the dispatcher to start once the store is up")
        assert proc.alive(), proc.output()
    finally:
        proc.stop()
        store.stop()


# -- groups --------------------------------------------------------------------------------

def test_groups_most_held_first_with_limit_and_queue(app, cli, make_app) -> None:
    fill(app)
    queue = queue_of(app)
    rows = [line.split() for line in cli("groups").output.splitlines()]
    names = [r[0] for r in rows if r and r[0] in ("acme", "globex", "initech")]
    assert names == ["acme", "globex", "initech"]  # 3, 2, 1 held
    data = json.loads(cli("groups", "--limit", "2", "--queue", queue, "--json").output)
    assert [g["group"] for g in data["queues"][0]["groups"]] == ["acme", "globex"]
    assert data["queues"][0]["group_count"] == 3
    result = cli("groups", "--queue", "nope")
    assert result.exit_code == 2 and "'--queue'" in result.output and "nope" in result.output
    result = cli("groups", "--limit", "0")
    assert result.exit_code == 2 and "'--limit'" in result.output


def test_groups_command_as_a_celery_process(app, redis_server, namespace) -> None:
    fill(app)
    done = run_celery(app, namespace, redis_server.url, "groups", "--json")
    assert done.returncode == 0, done.stderr
    [q] = json.loads(done.stdout)["queues"]
    assert {g["group"]: g["held_background"] for g in q["groups"]} == \
        {"acme": 3, "globex": 2, "initech": 0}


def test_status_command_as_a_celery_process(app, redis_server, namespace) -> None:
    fill(app)
    done = run_celery(app, namespace, redis_server.url, "status")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert [queue_of(app), "6", "1"] in [r[:3] for r in rows] and "acme" in done.stdout


# -- limit ---------------------------------------------------------------------------------

def test_limit_applies_at_once_to_a_running_dispatcher(make_app, cli, worker,
                                                       dispatcher) -> None:
    app = make_app(fair_default_concurrency=1)
    queue = queue_of(app)
    store = store_for(app)
    for i in range(6):
        app.tasks["proj.work"].delay("acme", str(i), 1.0)
    with worker(concurrency=4), dispatcher(app):
        wait_for(lambda: store.queue_figures(queue).inflight == 1, what="one in flight")
        result = cli("limit", "acme", "--concurrency", "3", "--weight", "2", the_app=app)
        assert result.output == f"group acme in queue {queue}: cap 3, weight 2\n"
        wait_for(lambda: store.queue_figures(queue).inflight == 3,
                 what="the new cap used at once")
        wait_for(lambda: settled(app), what="all done")
    assert app.ledger.max_running()["acme"] == 3
    # a dispatcher (re)starting writes the settings again: the runtime limit stays
    Dispatcher(app).step()
    [row] = store.group_figures(queue, ["acme"])
    assert (row.cap, row.weight, row.limited) == (3, 2.0, ("cap", "weight"))
    assert cli("limit", "acme", "--reset", the_app=app).output == \
        f"group acme in queue {queue}: cap 1, weight 1\n"
    assert cli("limit", "acme", "--concurrency", "none", the_app=app).output == \
        f"group acme in queue {queue}: no cap, weight 1\n"
    assert cli("limit", "acme", the_app=app).output == \
        f"group acme in queue {queue}: no cap, weight 1\n"   # no option: shows them


@pytest.mark.parametrize("args, named", [
    (["acme", "--concurrency", "-1"], "'--concurrency'"),
    (["acme", "--concurrency", "lots"], "'--concurrency'"),
    (["acme", "--weight", "0"], "'--weight'"),
    (["acme", "--weight", "heavy"], "'--weight'"),
    (["bad\x00group", "--weight", "2"], "'GROUP'"),
    (["acme", "--reset", "--weight", "2"], "--reset"),
])
def test_limit_bad_arguments_name_the_option(app, cli, args, named) -> None:
    fill(app)
    result = cli("limit", *args)
    assert result.exit_code == 2 and named in result.output, result.output


def test_limit_caps_a_subgroup_path(make_app, cli) -> None:
    """Under fair_subgroup 'path' ``limit acme/alice --concurrency 2`` caps the subgroup
    (caps per subgroup, on Redis); a weight on the path is taken too."""
    app = make_app(fair_subgroup="path")
    app.tasks["proj.work"].delay("acme/alice", "a")
    Dispatcher(app).step()  # writes the settings: the queue's subgroup is 'path'
    capped = cli("limit", "acme/alice", "--concurrency", "2", the_app=app)
    assert capped.exit_code == 0 and "cap 2" in capped.output, capped.output
    taken = cli("limit", "acme/alice", "--weight", "2", the_app=app)
    assert taken.exit_code == 0 and "weight 2" in taken.output, taken.output

def test_limit_needs_a_queue_before_anything_was_held(cli) -> None:
    result = cli("limit", "acme", "--concurrency", "2")
    assert result.exit_code == 2 and "--queue" in result.output


def test_limit_command_as_a_celery_process(app, redis_server, namespace) -> None:
    queue = queue_of(app)
    done = run_celery(app, namespace, redis_server.url, "limit", "acme", "--queue", queue,
                      "--concurrency", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"group acme in queue {queue}: cap 0, weight 1\n"
    app.tasks["proj.work"].delay("acme", "x")
    assert store_for(app).pick(queue, 5, None, int(time.time() * 1000), 10_000) == []  # paused


# -- inspect -------------------------------------------------------------------------------

def test_inspect_held_task_position_and_estimate(app, cli) -> None:
    ids = fill(app)
    target = ids["acme"][2]
    where = json.loads(cli("inspect", target, "--json").output)
    assert (where["state"], where["queue"], where["group"], where["class"]) == \
        ("held", queue_of(app), "acme", "background")
    assert (where["position"], where["group_held"], where["ready"]) == (3, 3, True)
    assert where["groups_ahead"] == 0
    text = cli("inspect", target).output
    assert f"task {target}: held in fair queue" in text and "position 3 of 3" in text
    assert "about 5 dispatches before it" in text
    # the real order: initech's interactive task, then acme and globex in turn
    picked = store_for(app).pick(queue_of(app), 10, None, int(time.time() * 1000), 10_000)
    order = [p.hold_id for p in picked]
    assert where["dispatches_before"] == order.index(target) == 5


def test_inspect_dispatched_delayed_and_unknown(app, cli) -> None:
    queue = queue_of(app)
    first = app.tasks["proj.work"].delay("acme", "a").id
    later = app.tasks["proj.work"].apply_async(("acme", "b"), countdown=600).id
    [picked] = store_for(app).pick(queue, 1, None, int(time.time() * 1000), 10_000)
    where = json.loads(cli("inspect", first, "--json").output)
    assert (where["state"], where["dispatch_id"]) == ("picked", picked.dispatch_id)
    assert json.loads(cli("inspect", later, "--json").output)["state"] == "delayed"
    result = cli("inspect", "no-such-task")
    assert result.exit_code == 0
    assert "no-such-task: not held by celery_fair (result state PENDING" in result.output


def test_inspect_command_as_a_celery_process(app, redis_server, namespace) -> None:
    ids = fill(app)
    done = run_celery(app, namespace, redis_server.url, "inspect", ids["globex"][1], "--json")
    assert done.returncode == 0, done.stderr
    where = json.loads(done.stdout)
    assert (where["group"], where["position"]) == ("globex", 2)


# -- one grammar: -Q/--queue on every subcommand that takes fair queues ----------------------

def two_queues(app: Any) -> list[str]:
    """The app's queue and a second one, each holding one acme task: both in the store."""
    queues = [queue_of(app), queue_of(app) + "-b"]
    for queue in queues:
        app.tasks["proj.work"].apply_async(("acme", "x"), queue=queue)
    assert store_for(app).queues() == sorted(queues)
    return queues


def acted_on(name: str, app: Any, namespace: str, redis_url: str, cli: Callable[..., Result],
             queue_args: list[str]) -> list[str]:
    """The fair queues subcommand ``name`` acted on when given ``queue_args``."""
    if name == "dispatch":  # its own process: it sets up logging as a worker does
        done = run_celery(app, namespace, redis_url, "dispatch", "--once", *queue_args,
                          conf={"fair_max_inflight": 5})
        assert done.returncode == 0, done.stdout + done.stderr
        return [q for q in store_for(app).queues() if store_for(app).queue_figures(q).inflight]
    args = {"status": ["status", "--json"], "groups": ["groups", "--json"],
            "check": ["check", "--json"], "limit": ["limit", "acme", "--weight", "2"]}[name]
    result = cli(*args, *queue_args)
    # check exits 1 on its findings: held work and no live dispatcher, here
    assert result.exit_code in ((0, 1) if name == "check" else (0,)), result.output
    if name == "limit":
        return [line.split(" in queue ")[1].split(":")[0] for line in
                result.output.splitlines()]
    data = json.loads(result.stdout)["queues"]  # stderr: the store's advice, if any
    return data if name == "check" else [q["queue"] for q in data]


SUBCOMMANDS = ["dispatch", "check", "groups", "limit", "status"]


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_queue_option_is_repeatable_and_comma_separated(name, make_app, namespace,
                                                        redis_server, cli) -> None:
    app = make_app()
    first, second = two_queues(app)
    third = first + "-c"  # a third queue holds nothing: a queue not named is left alone
    app.tasks["proj.work"].apply_async(("acme", "x"), queue=third)
    run = lambda *args: acted_on(name, app, namespace, redis_server.url,  # noqa: E731
                                 lambda *a: cli(*a, the_app=app), list(args))
    assert sorted(run("-Q", first, "-Q", second)) == [first, second]
    if name == "dispatch":  # dispatched now: the comma form must dispatch again
        store_for(app).flush()
        for queue in (first, second, third):
            app.tasks["proj.work"].apply_async(("acme", "x"), queue=queue)
    assert sorted(run("-Q", f"{first},{second}")) == [first, second]
    if name != "dispatch":  # the same callback: once in its own process is enough
        assert sorted(run("--queue", f" {second} ,", "--queue", first)) == [first, second]


def test_the_old_queues_spelling_still_works_unlisted(app, cli) -> None:
    """dispatch and check had ``-Q/--queues``: it still parses (dispatch's: in
    test_dispatch_pidfile_logfile_and_loglevel), and --help shows only -Q/--queue."""
    first, second = two_queues(app)
    result = cli("check", "--json", "--queues", f"{first},{second}")
    assert sorted(json.loads(result.stdout)["queues"]) == [first, second]
    for name in SUBCOMMANDS:
        shown = cli(name, "--help").output
        assert "-Q, --queue QUEUE" in shown and "--queues" not in shown, shown


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_an_unknown_queue_is_refused_listing_the_known(name, app, namespace, redis_server,
                                                       cli) -> None:
    first, second = two_queues(app)
    args = {"dispatch": ["dispatch", "--once"], "check": ["check"], "groups": ["groups"],
            "limit": ["limit", "acme", "--concurrency", "1"], "status": ["status"]}[name]
    before = store_for(app).snapshot(first)
    if name == "dispatch":
        done = run_celery(app, namespace, redis_server.url, *args, "-Q", f"{first},nosuch")
        code, out = done.returncode, done.stdout + done.stderr
    else:
        result = cli(*args, "-Q", first, "-Q", "nosuch")
        code, out = result.exit_code, result.output
    assert code == 2, out
    assert "no fair queue named nosuch; known fair queues: " in out, out
    assert first in out and second in out, out  # the known ones, to pick from
    assert "ok" not in out.split("known fair queues")[0]  # check does not report ok
    assert store_for(app).snapshot(first) == before  # nothing done, nothing stored
    assert "nosuch" not in store_for(app).queues()


def test_limit_on_an_unknown_queue_stores_nothing_and_says_create(app, cli) -> None:
    store = store_for(app)
    result = cli("limit", "acme", "-Q", "later", "--concurrency", "0")
    assert result.exit_code == 2 and "add --create" in result.output, result.output
    app.tasks["proj.work"].apply_async(("acme", "x"), queue="later")
    assert len(store.pick("later", 5, None, int(time.time() * 1000), 10_000)) == 1


def test_limit_create_sets_limits_before_the_first_task(app, cli) -> None:
    store = store_for(app)
    result = cli("limit", "acme", "-Q", "later", "--create", "--concurrency", "0",
                 "--weight", "3")
    assert result.exit_code == 0, result.output
    assert result.output == "group acme in queue later: cap 0, weight 3\n"
    assert "later" not in store.queues()  # known from its first task on
    app.tasks["proj.work"].apply_async(("acme", "x"), queue="later")
    globex = app.tasks["proj.work"].apply_async(("globex", "y"), queue="later").id
    picked = store.pick("later", 5, None, int(time.time() * 1000), 10_000)
    assert [p.hold_id for p in picked] == [globex]  # acme is paused from the start
    [row] = store.group_figures("later", ["acme"])
    assert (row.cap, row.weight, row.limited) == (0, 3.0, ("cap", "weight"))
    result = cli("limit", "acme", "--create", "--concurrency", "1")
    assert result.exit_code == 2 and "--create needs" in result.output, result.output


def test_a_queue_the_app_declares_is_known_before_its_first_task(make_app, cli) -> None:
    app = make_app(task_routes={"proj.report*": {"queue": "reports"}, "x.y": "exports"})
    for queue in ("reports", "exports", queue_of(app)):  # routes, task_default_queue
        result = cli("limit", "acme", "-Q", queue, "--weight", "2", the_app=app)
        assert result.exit_code == 0, result.output
        [q] = json.loads(cli("status", "--json", "-Q", queue, the_app=app).output)["queues"]
        assert (q["queue"], q["held_background"], q["capacity"]) == (queue, 0, 0)
    assert store_for(app).queues() == []
    result = cli("groups", "-Q", "nosuch", the_app=app)
    assert result.exit_code == 2
    assert f"known fair queues: exports, {queue_of(app)}, reports " in result.output


# -- dispatch: --pidfile, --logfile, --loglevel as celery worker has them --------------------

def test_dispatch_pidfile_logfile_and_loglevel(app, redis_server, namespace, tmp_path) -> None:
    pidfile, logfile = tmp_path / "fair.pid", tmp_path / "fair.log"
    app.tasks["proj.work"].delay("acme", "x")  # a queue to serve: its line is INFO
    first = CeleryProcess(["fair", "dispatch", "--pidfile", str(pidfile), "--logfile",
                           str(logfile), "-l", "info"], {}, redis_server.url + "/0",
                          namespace, tmp_path / "first.out")
    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() == str(first.pid),
                 what="the dispatcher to write its pid")
        wait_for(lambda: logfile.exists() and "serving fair queue" in logfile.read_text(),
                 what="the log lines in --logfile")
        text = logfile.read_text()
        assert f"INFO/MainProcess] serving fair queue {queue_of(app)}" in text, text
        second = run_celery(app, namespace, redis_server.url, "dispatch", "--pidfile",
                            str(pidfile))
        assert second.returncode == 73, second.stdout + second.stderr  # EX_CANTCREAT
        assert f"Pidfile ({pidfile}) already exists" in second.stderr, second.stderr
        assert first.alive(), first.output()
    finally:
        assert first.stop() is not None
    assert not pidfile.exists()  # released at exit, as celery worker does
    assert "serving fair queue" not in first.output()  # logged to the file, not stderr
    # --loglevel: at WARNING the INFO lines the same step logged at info above are left out
    quiet = tmp_path / "quiet.log"
    done = run_celery(app, namespace, redis_server.url, "dispatch", "--once", "-f",
                      str(quiet), "--loglevel", "WARNING", "--queues", queue_of(app),
                      conf={"fair_max_inflight": 1})  # --queues: the old spelling works
    assert done.returncode == 0 and "dispatched 1," in done.stdout, done.stderr
    assert "INFO" not in quiet.read_text() and "DEBUG" not in quiet.read_text()


def test_dispatch_refuses_a_bad_loglevel(cli) -> None:
    result = cli("dispatch", "--once", "-l", "LOUD")  # refused before logging is set up
    assert result.exit_code == 2 and "'-l' / '--loglevel'" in result.output, result.output


# -- status: oldest wait, capacity and ahead, the same capacity as Flower's -------------------

def test_status_capacity_is_the_flower_pages_and_the_dispatchers(app, cli, caplog) -> None:
    """One definition (summary.queue_capacity): status, the summary Flower's page and API
    read (read_summaries), and the dispatcher's log give the same capacity and ahead."""
    fill(app)
    store, queue = store_for(app), queue_of(app)
    now = int(time.time() * 1000)
    store.register_worker(queue, "w1", 4, now + 60_000, now)
    assert len(store.pick(queue, 6, None, now, 10_000)) == 6  # 4 slots + 2 ahead
    app.tasks["proj.work"].delay("acme", "more")
    caplog.set_level(logging.INFO, logger="celery_fair.dispatcher")
    dispatcher = Dispatcher(app)
    try:
        assert dispatcher.step().dispatched == 0  # at its limit: 6 in flight
        flower = wait_for(lambda: read_summaries(store).get(queue), what="the summary")
    finally:
        dispatcher.close()
    [q] = json.loads(cli("status", "--json").output)["queues"]
    assert (q["inflight"], q["capacity"], q["dispatch_ahead"], q["inflight_limit"]) == \
        (flower["inflight"], flower["capacity"], flower["dispatch_ahead"],
         flower["inflight_limit"]) == (6, 4, 2, 6)
    assert f"queue {queue}: capacity 4 (+2 ahead)" in caplog.messages
    assert dispatcher.capacity(queue) == 4  # what /metrics shows as celery_fair_capacity
    rows = [line.split() for line in cli("status").output.splitlines()]
    header = next(r for r in rows if r[:1] == ["queue"])
    assert " ".join(header) == "queue held interactive delayed in flight capacity ahead " \
                               "oldest wait head wait groups released policy"
    row = next(r for r in rows if r[:1] == [queue])
    assert row[1:7] == ["1", "0", "0", "6", "4", "2"]  # held, inter., delayed, in flight, ...


def test_status_shows_the_oldest_wait(app, cli) -> None:
    app.tasks["proj.work"].delay("acme", "first")
    held_at = time.time()
    app.tasks["proj.work"].delay("globex", "second")
    [q] = json.loads(cli("status", "--json").output)["queues"]
    waits = {g["group"]: g["oldest_wait"] for g in q["groups"]}
    assert q["oldest_wait"] == waits["acme"] == max(waits.values())
    assert 0 <= q["oldest_wait"] <= time.time() - held_at + 0.5
    app.tasks["proj.work"].apply_async(("late", "x"), countdown=60)  # not due: no wait
    [q] = json.loads(cli("status", "--json").output)["queues"]
    assert {g["group"]: g["oldest_wait"] for g in q["groups"]}["late"] is None
    assert q["head_wait"] == max(g["head_wait"] for g in q["groups"] if g["head_wait"])
    text = cli("status").output
    assert "oldest wait" in text and "head wait" in text and " ms " in text, text


def test_dispatch_refuses_queues_its_shard_does_not_serve(cli: Callable[..., Result]) -> None:
    """``--shard 1/3 -Q a,b`` where a queue is in another shard would leave that queue
    unserved without a word: refused before the dispatcher starts, naming each one's."""
    from celery_fair.shards import Shard

    names = [f"q{i}" for i in range(12)]
    mine = next(q for q in names if Shard(1, 3).serves(q))
    other = next(q for q in names if not Shard(1, 3).serves(q))
    result = cli("dispatch", "--shard", "1/3", "-Q", f"{mine},{other}", "--once")
    assert result.exit_code == 2, result.output
    assert f"{other!r} is in shard {Shard(0, 3).of(other)}/3" in result.output
    assert repr(mine) not in result.output
