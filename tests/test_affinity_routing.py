"""``fair_affinity = "hash"`` end to end: real worker processes with distinct hostnames, a
real dispatcher, the Redis store and broker. Each task records, from inside, the worker it
ran on (``proj.sticky``: ``self.request.hostname``).

- every task of a group runs on the worker the hash assigns it;
- SIGKILL a worker: its groups move to the others (its dispatches come back through their
  leases), nothing is lost or runs to its end twice, the other groups stay where they were;
- a 4th worker joins: only the groups whose owner changed change host;
- on the SQL store (PostgreSQL; broker, results and ledger on Redis): every task of a
  group on its assigned worker, each once, every routed slot back.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Any

from celery_fair.affinity import owner
from celery_fair.config import get_config
from celery_fair.store.registry import slot_table
from celery_fair.summary import queue_status
from celery_fair.task import store_for

from .conftest import DispatcherThread, wait_for
from .helpers import queue_of, settled
from .procs import CeleryProcess

GROUPS = [f"tenant-{i}" for i in range(12)]
CONF = {"fair_affinity": "hash", "fair_lease_seconds": 3, "task_acks_late": True,
        "task_reject_on_worker_lost": True}


def start_worker(name: str, queue: str, url: str, namespace: str, log: Any,
                 conf: dict[str, Any] = CONF) -> CeleryProcess:
    return CeleryProcess(["worker", "-P", "threads", "-c", "2", "-Q", queue,
                          "-n", f"{name}-{namespace}@%h", "--without-mingle",
                          "--without-gossip", "--without-heartbeat"], conf, url, namespace,
                         log)


def table_of(app: Any) -> list[str | None]:
    store, queue = store_for(app), queue_of(app)
    return slot_table(store.live_workers(queue, int(time.time() * 1000)))


def hold_batch(app: Any, batch: str, per_group: int, duration: float) -> list[str]:
    sticky, labels = app.tasks["proj.sticky"], []
    for n in range(per_group):
        for group in GROUPS:
            label = f"{batch}-{group}-{n}"
            sticky.delay(group, label, duration)
            labels.append(label)
    return labels


def done_of(ledger: Any, labels: list[str]) -> list[dict[str, Any]]:
    wanted = set(labels)
    return [d for d in ledger.hosts("done") if d["label"] in wanted]


def hosts_by_group(entries: list[dict[str, Any]]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for entry in entries:
        found[entry["group"]].add(entry["host"])
    return found


def test_groups_run_on_their_worker_move_on_a_kill_and_on_a_join_only_as_hashed(
        make_app, redis_server, namespace, tmp_path) -> None:
    app = make_app(**CONF)
    queue, url, ledger = queue_of(app), redis_server.url + "/0", app.ledger
    workers = {name: start_worker(name, queue, url, namespace, tmp_path / f"{name}.log")
               for name in ("w1", "w2", "w3")}

    def all_done(labels: list[str]) -> bool:
        return len(done_of(ledger, labels)) >= len(labels)

    try:
        wait_for(lambda: len([w for w in table_of(app) if w]) == 3, timeout=90,
                 what="three workers registered")
        with DispatcherThread(app, queues=[queue]) as dispatcher:
            # 1. every task of a group on the group's worker
            table = table_of(app)
            first = hold_batch(app, "one", 4, 0.02)
            wait_for(lambda: all_done(first), timeout=90, what="the first batch ran")
            ran = hosts_by_group(done_of(ledger, first))
            assert ran == {g: {owner(g, table)} for g in GROUPS}, (ran, table)
            assert len({h for hosts in ran.values() for h in hosts}) >= 2  # it spreads
            assert store_for(app).assignments(queue) == {g: owner(g, table) for g in GROUPS}

            # 2. SIGKILL w2 while it runs and holds tasks: its groups move, nothing is
            # lost, nothing runs to its end twice, the other groups stay
            w2 = next(h for h in table if h and h.startswith("w2-"))
            w2_groups = {g for g in GROUPS if owner(g, table) == w2}
            assert w2_groups, table
            second = hold_batch(app, "two", 6, 0.2)
            wait_for(lambda: any(e["host"] == w2 and e["label"].startswith("two-")
                                 for e in ledger.hosts("on")), timeout=60,
                     what="w2 running the second batch")
            workers["w2"].kill_group()
            killed_at = time.time()
            wait_for(lambda: all_done(second), timeout=120, what="the second batch ran")
            after = table_of(app)
            assert w2 not in after and len([w for w in after if w]) == 2
            done = done_of(ledger, second)
            assert Counter(d["label"] for d in done) == Counter(second)  # once each
            for entry in done:
                group = entry["group"]
                if group not in w2_groups:
                    assert entry["host"] == owner(group, table), entry
                elif entry["host"] != w2:  # moved: to the group's new owner
                    assert entry["host"] == owner(group, after), entry
                    assert entry["t"] > killed_at
            assert {g for g in GROUPS if owner(g, table) != owner(g, after)} == w2_groups
            moves = queue_status(store_for(app), get_config(app), queue, 5)
            assert moves["affinity_moves"] >= 1 and moves["affinity"] == "hash"

            # 3. a 4th worker joins: only the groups whose owner changed change host
            workers["w4"] = start_worker("w4", queue, url, namespace, tmp_path / "w4.log")
            wait_for(lambda: len([w for w in table_of(app) if w]) == 3, timeout=90,
                     what="the fourth worker registered")
            joined = table_of(app)
            moved = {g for g in GROUPS if owner(g, after) != owner(g, joined)}
            assert moved and all(owner(g, joined).startswith("w4-") for g in moved)
            wait_for(lambda: dispatcher.router.table(queue) == joined, timeout=30,
                     what="the dispatcher routing over the fourth worker")
            third = hold_batch(app, "three", 3, 0.02)
            wait_for(lambda: all_done(third), timeout=90, what="the third batch ran")
            ran3 = hosts_by_group(done_of(ledger, third))
            assert ran3 == {g: {owner(g, joined)} for g in GROUPS}, (ran3, joined)
            changed = {g for g in GROUPS if ran3[g] != {owner(g, after)}}
            assert changed == moved
            wait_for(lambda: settled(app), timeout=30, what="every slot released")
            assert store_for(app).worker_inflight(queue) == {}
            assert dispatcher.router.routes(queue)
    except BaseException:
        for proc in workers.values():
            print(proc.output())
        raise
    finally:
        for proc in workers.values():
            proc.stop()


def test_groups_run_on_their_worker_on_the_postgresql_store(
        make_app, redis_server, namespace, tmp_path, sql_url) -> None:
    conf = {**CONF, "fair_store_url": sql_url("postgresql")}
    app = make_app(**conf)
    queue, url, ledger = queue_of(app), redis_server.url + "/0", app.ledger
    workers = [start_worker(name, queue, url, namespace, tmp_path / f"{name}.log", conf)
               for name in ("w1", "w2", "w3")]
    try:
        wait_for(lambda: len([w for w in table_of(app) if w]) == 3, timeout=90,
                 what="three workers registered in the SQL store")
        with DispatcherThread(app, queues=[queue]):
            table = table_of(app)
            labels = hold_batch(app, "sql", 4, 0.05)
            wait_for(lambda: len(done_of(ledger, labels)) >= len(labels), timeout=120,
                     what="the batch ran")
            done = done_of(ledger, labels)
            assert Counter(d["label"] for d in done) == Counter(labels)  # once each
            ran = hosts_by_group(done)
            assert ran == {g: {owner(g, table)} for g in GROUPS}, (ran, table)
            assert len({h for hosts in ran.values() for h in hosts}) >= 2  # it spreads
            store: Any = store_for(app)
            assert "postgresql" in store.where  # the map and the routed picks are SQL's
            assert store.assignments(queue) == {g: owner(g, table) for g in GROUPS}
            wait_for(lambda: settled(app), timeout=30, what="every slot released")
            assert store.worker_inflight(queue) == {} and store.affinity_moves(queue) == 0
    except BaseException:
        for proc in workers:
            print(proc.output())
        raise
    finally:
        for proc in workers:
            proc.stop()
