"""``fair_group_queues`` (dedicated pools) end to end: a real dispatcher, the Redis store
or the SQL store on PostgreSQL (``store_backend``), the Redis or RabbitMQ broker, one
worker process consuming the fair queue and one consuming "vip". Each task records, from
inside, the worker it ran on (``proj.sticky``).

- while no worker consumes "vip", the vip groups wait held (the main worker's free slots
  are not theirs) and the other groups run on the main worker;
- once a vip worker is up, the vip groups run there and only there, every task once,
  every group within its cap, every slot given back.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from celery_fair.cli_render import policy_cell
from celery_fair.config import get_config
from celery_fair.group_queues import target
from celery_fair.summary import queue_status
from celery_fair.task import store_for

from .conftest import DispatcherThread, wait_for
from .helpers import held, queue_of, settled
from .procs import CeleryProcess, stopped_after

VIP, OTHERS = ["vip-1", "vip-2"], ["t-1", "t-2", "t-3"]
CAP = 2
CONF = {"fair_group_queues": {"vip-*": "vip"}, "fair_default_concurrency": CAP,
        "fair_lease_seconds": 5, "task_acks_late": True}


def start_worker(name: str, queue: str, app: Any, store: str, namespace: str,
                 log: Any) -> CeleryProcess:
    conf = {**CONF, "fair_store_url": get_config(app).store_url}  # celery_fair's store
    return CeleryProcess(["worker", "-P", "threads", "-c", "3", "-Q", queue,
                          "-n", f"{name}-{namespace}@%h", "--without-mingle",
                          "--without-gossip", "--without-heartbeat"], conf,
                         app.conf.broker_url, namespace, log, store=store)


def hold_batch(app: Any, per_group: int, duration: float) -> list[str]:
    sticky, labels = app.tasks["proj.sticky"], []
    for n in range(per_group):
        for group in VIP + OTHERS:
            label = f"{group}-{n}"
            sticky.delay(group, label, duration)
            labels.append(label)
    return labels


def test_vip_groups_run_only_on_the_vip_workers_and_wait_for_them(
        make_app, redis_server, namespace, tmp_path, broker, store_backend) -> None:
    """Once per broker (Redis, RabbitMQ) and store (Redis, PostgreSQL)."""
    app = make_app(**CONF)
    queue, url, ledger, store = queue_of(app), redis_server.url + "/0", app.ledger, \
        store_for(app)
    workers = {"main": start_worker("main", queue, app, url, namespace,
                                    tmp_path / "main.log")}
    assert ("postgresql" in store.where) == (store_backend == "postgresql")

    def pools(name: str) -> dict[str, int]:
        return store.worker_pools(name, int(time.time() * 1000))

    with stopped_after(workers):
        wait_for(lambda: pools(queue), timeout=90, what="the main worker registered")
        labels = hold_batch(app, 4, 0.1)
        with DispatcherThread(app, queues=[queue]) as dispatcher:
            # 1. no vip worker: the others run on the main worker, the vip groups wait
            others = {lb for lb in labels if not lb.startswith("vip-")}
            wait_for(lambda: others <= {d["label"] for d in ledger.hosts("done")},
                     timeout=90, what="the other groups ran")
            assert not any(d["group"] in VIP for d in ledger.hosts("on"))
            assert held(app) == {g: 4 for g in VIP}

            # 2. a vip worker comes up: the vip groups run there, and only there
            workers["vip"] = start_worker("vip", "vip", app, url, namespace,
                                          tmp_path / "vip.log")
            wait_for(lambda: len({d["label"] for d in ledger.hosts("done")}) >= len(labels),
                     timeout=90, what="every task ran")
            done = ledger.hosts("done")
            assert Counter(d["label"] for d in done) == Counter(labels)  # once each
            hosts = {d["group"]: set() for d in done}
            for entry in done:
                hosts[entry["group"]].add(entry["host"].split("-")[0])
            assert hosts == {**{g: {"vip"} for g in VIP}, **{g: {"main"} for g in OTHERS}}
            assert max(ledger.max_running().values()) <= CAP
            wait_for(lambda: settled(app), timeout=30, what="every slot released")
            assert store.worker_inflight(queue) == {}
            assert store.assignments(queue) == {**{g: target("vip") for g in VIP},
                                                **{g: target(queue) for g in OTHERS}}
            assert dispatcher.router.routes(queue)
            status = queue_status(store, get_config(app), queue, 5)  # fair status's
            assert status["group_queues"] == {"vip-*": "vip"}
            assert policy_cell(status) == "wfq, queues vip-*→vip"
