"""``celery -A proj fair workers`` with real worker processes: slots in start order, the
hash's groups per worker, a leaving worker's slot left empty (``store/registry.py``)."""

from __future__ import annotations

import json
import time
from typing import Any

from celery_fair.affinity import owner
from celery_fair.cli_workers import render_workers
from celery_fair.task import store_for

from .conftest import wait_for
from .control_helpers import cli
from .helpers import queue_of
from .procs import CeleryProcess
from .test_cli import fill, run_celery


def start_worker(name: str, pool: int, queue: str, redis_url: str, namespace: str,
                 log: Any) -> CeleryProcess:
    return CeleryProcess(["worker", "-P", "threads", "-c", str(pool), "-Q", queue,
                          "-n", f"{name}-{namespace}@%h", "--without-mingle",
                          "--without-gossip", "--without-heartbeat"], {},
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
        # the table as people read it
        done = run_celery(app, namespace, url, "workers", "-Q", queue)
        assert done.returncode == 0, done.stderr
        for word in ("slot", "groups (hash)", alpha, bravo):
            assert word in done.stdout, done.stdout

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
