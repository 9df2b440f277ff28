"""``celery -A proj fair workers`` with real worker processes: slots in start order, the
hash's groups per worker, a leaving worker's slot left empty (``store/registry.py``); on a
queue routed by ``fair_affinity = "hash"``, the groups the store's map gives each worker
and its free slots, with a real dispatcher routing real tasks."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest

from celery_fair.affinity import owner
from celery_fair.cli_workers import read_workers, render_workers
from celery_fair.store.registry import slot_table
from celery_fair.task import store_for

from .conftest import DispatcherThread, wait_for
from .control_helpers import cli
from .helpers import queue_of
from .procs import CeleryProcess
from .store_helpers import LEASE, NOW, Q, hold
from .test_cli import fill, run_celery

#: A queue routed by worker (the workers get it too: they then consume their own queue).
ROUTED = {"fair_affinity": "hash"}


def start_worker(name: str, pool: int, queue: str, redis_url: str, namespace: str,
                 log: Any, conf: dict[str, Any] | None = None) -> CeleryProcess:
    return CeleryProcess(["worker", "-P", "threads", "-c", str(pool), "-Q", queue,
                          "-n", f"{name}-{namespace}@%h", "--without-mingle",
                          "--without-gossip", "--without-heartbeat"], conf or {},
                         redis_url, namespace, log)


def listed(app: Any, namespace: str, redis_url: str, *args: str) -> list[dict[str, Any]]:
    done = run_celery(app, namespace, redis_url, "workers", "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["queues"]  # type: ignore[no-any-return]


def test_fair_workers_lists_live_workers_by_slot_in_start_order(
        app, redis_server, namespace, tmp_path) -> None:
    queue, url = queue_of(app), redis_server.url
    store = store_for(app)

    def live() -> list[str]:
        return [w.hostname for w in store.live_workers(queue, int(time.time() * 1000))]

    first = start_worker("alpha", 2, queue, url + "/0", namespace, tmp_path / "a.log")
    second = None
    try:
        wait_for(lambda: len(live()) == 1, timeout=60, what="the first worker registered")
        second = start_worker("bravo", 3, queue, url + "/0", namespace, tmp_path / "b.log")
        wait_for(lambda: len(live()) == 2, timeout=60, what="the second worker registered")
        fill(app)  # acme, globex, initech hold work (no dispatcher: it stays held)
        [doc] = listed(app, namespace, url, "-Q", queue)
        alpha, bravo = f"alpha-{namespace}@", f"bravo-{namespace}@"
        assert doc["queue"] == queue and doc["groups"] == 3
        a, b = doc["workers"]
        assert (a["slot"], b["slot"]) == (0, 1)
        assert a["hostname"].startswith(alpha) and b["hostname"].startswith(bravo)
        assert (a["pool"], b["pool"]) == (2, 3) and a["queues"] == b["queues"] == [queue]
        assert a["started_ms"] <= b["started_ms"] and a["started_at"].endswith("+00:00")
        table = [a["hostname"], b["hostname"]]
        expected = {h: sum(owner(g, table) == h for g in ("acme", "globex", "initech"))
                    for h in table}
        assert {w["hostname"]: w["groups_hash"] for w in doc["workers"]} == expected
        # not routed: no map, and in flight is not known per worker
        assert doc["routed"] is False
        assert all(w["groups_assigned"] is None and w["inflight"] is None
                   and w["free_slots"] is None for w in doc["workers"])
        # the table as people read it
        done = run_celery(app, namespace, url, "workers", "-Q", queue)
        assert done.returncode == 0, done.stderr
        for word in ("slot", "groups (hash)", "free slots", alpha, bravo,
                     f"free slots —: not routed ({queue})"):
            assert word in done.stdout, done.stdout
        assert "groups assigned" not in done.stdout
        rows = [line.split() for line in done.stdout.splitlines() if alpha in line]
        assert [row[-1] for row in rows] == ["—"], done.stdout

        first.stop()  # unregisters: its slot stays empty, bravo keeps slot 1
        wait_for(lambda: len(live()) == 1, timeout=60, what="the first worker gone")
        [doc] = listed(app, namespace, url, "-Q", queue)
        [b_after] = doc["workers"]
        assert (b_after["hostname"], b_after["slot"]) == (b["hostname"], 1)
        assert b_after["started_ms"] == b["started_ms"] and b_after["groups_hash"] == 3
    except BaseException:
        print(first.output(), second.output() if second else "")
        raise
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_fair_workers_without_workers_says_so(app) -> None:
    fill(app)
    result = cli(app, "workers")
    assert result.exit_code == 0 and "no live worker" in result.output, result.output
    result = cli(app, "workers", "--json")
    assert json.loads(result.output)["queues"][0]["workers"] == []
    result = cli(app, "workers", "-Q", "nope")
    assert result.exit_code == 2 and "nope" in result.output
    assert render_workers([]).plain == "no fair queues yet"


def owned_by(table: list[str | None], hostname: str, count: int) -> list[str]:
    """The first ``count`` tenant names the hash over ``table`` gives ``hostname``."""
    names = (f"tenant-{i}" for i in itertools.count())
    return list(itertools.islice((g for g in names if owner(g, table) == hostname), count))


def test_fair_workers_shows_a_routed_queue_s_assigned_groups_and_free_slots(
        make_app, redis_server, namespace, tmp_path) -> None:
    app = make_app(**ROUTED)
    queue, url, store = queue_of(app), redis_server.url + "/0", store_for(app)
    procs = [start_worker("alpha", 3, queue, url, namespace, tmp_path / "a.log", ROUTED),
             start_worker("bravo", 2, queue, url, namespace, tmp_path / "b.log", ROUTED)]

    def table() -> list[str | None]:
        return slot_table(store.live_workers(queue, int(time.time() * 1000)))

    try:
        wait_for(lambda: len([h for h in table() if h]) == 2, timeout=60,
                 what="both workers registered")
        slots = table()
        alpha, bravo = (next(h for h in slots if h and h.startswith(f"{name}-"))
                        for name in ("alpha", "bravo"))
        [mine] = owned_by(slots, alpha, 1)
        theirs = owned_by(slots, bravo, 2)
        work = app.tasks["proj.work"]
        work.delay(mine, "a", 300)  # long runs: in flight while the command reads
        for group, n in itertools.product(theirs, range(3)):
            work.delay(group, f"{group}-{n}", 300)
        with DispatcherThread(app, queues=[queue]):
            # alpha: its one task of 3 slots; bravo: 2 running and its 2 dispatched ahead
            # (pool + fair_dispatch_ahead each), the other 2 held for it
            wait_for(lambda: store.worker_inflight(queue) == {alpha: 1, bravo: 4},
                     timeout=60, what="the tasks routed to their workers")
            result = cli(app, "workers", "--json", "-Q", queue)
            text = cli(app, "workers", "-Q", queue).output
        assert result.exit_code == 0, result.output
        [doc] = json.loads(result.output)["queues"]
        assert doc["routed"] is True and doc["groups"] == 3
        got = {w["hostname"]: (w["groups_assigned"], w["inflight"], w["free_slots"],
                               w["groups_hash"]) for w in doc["workers"]}
        # bravo has more in flight than its pool: no free slot, not a negative one
        assert got == {alpha: (1, 1, 2, None), bravo: (2, 4, 0, None)}, doc
        # the table as people read it: groups assigned of the map, then free slots
        assert "groups assigned" in text and "free slots" in text, text
        assert "groups (hash)" not in text and "not routed" not in text, text
        cells = {h: line.split()[-2:] for line in text.splitlines()
                 for h in (alpha, bravo) if h in line}
        assert cells == {alpha: ["1/3", "2"], bravo: ["2/3", "0"]}, text
    except BaseException:
        print(*(proc.output() for proc in procs))
        raise
    finally:
        for proc in procs:  # the long runs would hold a warm shutdown
            proc.kill_group()
            proc.stop()


# -- what the store's map and in-flight counts name beyond the live workers ----------------

@pytest.mark.parametrize("any_store", ["redis"], indirect=True)
def test_a_gone_worker_with_routed_tasks_in_flight_and_dedicated_queues_are_listed(
        any_store) -> None:
    """A worker whose registration expired while its routed tasks are in flight is listed
    '(gone)' with them; a queue with fair_group_queues lists its dedicated queues."""
    store, alive, gone, vip = any_store, "alive@h", "gone@h", "queue:vip"
    for group in ("g1", "g2", "g3"):
        for n in range(2):
            hold(store, group, hold_id=f"{group}-{n}")
    store.assign(Q, [("g1", "", alive), ("g2", "", gone), ("g3", "", vip)])
    got = store.pick_routed(Q, 10, None, NOW, LEASE, {alive: 1, gone: 2, vip: 1}, None)
    assert sorted(got.workers) == sorted([alive, gone, gone, vip])
    store.register_worker(Q, alive, 4, NOW + 60_000, NOW)
    store.register_worker(Q, gone, 2, NOW + 10, NOW - 5_000)  # expired at the read
    [doc] = read_workers(store, [Q], NOW + 1_000, routed={Q}, dedicated={Q})
    rows = {w["hostname"]: w for w in doc["workers"]}
    assert list(rows) == [alive, gone] and doc["groups"] == 2
    assert (rows[alive]["gone"], rows[alive]["inflight"], rows[alive]["free_slots"]) == \
        (False, 1, 3)
    assert {k: rows[gone][k] for k in ("gone", "groups_assigned", "inflight", "pool",
                                       "slot", "free_slots")} == \
        {"gone": True, "groups_assigned": 1, "inflight": 2, "pool": None, "slot": None,
         "free_slots": None}
    assert doc["dedicated"] == [{"queue": "vip", "groups": 1, "inflight": 1}]
    text = _text(render_workers([doc]))
    assert "gone@h (gone)" in text and "vip (1 group, 1 in flight)" in text, text
    # the same read without the routing: neither gone workers nor dedicated queues
    [plain] = read_workers(store, [Q], NOW + 1_000)
    assert [w["hostname"] for w in plain["workers"]] == [alive] and plain["dedicated"] == []


def _text(renderable: Any) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()
