"""The app ``python -m bench cpu`` runs as separate processes (``celery -A bench.cpu_proj
worker|fair dispatch``, and ``python -m bench.cpu_proj N G``, the publisher), configured
from the environment (``CPU_*``). The publisher prints its loop's wall time last
(``published-in SECONDS``). Each task counts its run on another redis-server than
the one measured (the broker and store), so the counting costs the measured one nothing."""

from __future__ import annotations

import json
import os
import sys
import time

import redis
from celery import Celery

from celery_fair import FairTask

app = Celery("cpu", broker=os.environ.get("CPU_BROKER", "redis://127.0.0.1:6379/0"),
             set_as_current=False)
app.conf.update(task_default_queue=os.environ.get("CPU_QUEUE", "cpu"),
                fair_key_prefix=os.environ.get("CPU_NS", "cpu"), task_ignore_result=True,
                worker_prefetch_multiplier=1, worker_hijack_root_logger=False,
                broker_connection_retry_on_startup=True)
if os.environ.get("CPU_STORE"):  # the broker is RabbitMQ: celery_fair's store stays Redis
    app.conf.fair_store_url = os.environ["CPU_STORE"]
# CPU_CONF: more settings, as JSON (a variant to measure: '{"fair_direct_push": false}')
app.conf.update(json.loads(os.environ.get("CPU_CONF") or "{}"))
_counter = redis.Redis.from_url(os.environ.get("CPU_COUNTER", "redis://127.0.0.1:6379/1"))
_KEY = os.environ.get("CPU_NS", "cpu") + ":done"


def _count(group: str) -> None:
    _counter.incr(_KEY)


plain = app.task(name="cpu.plain", shared=False)(_count)
fair = app.task(name="cpu.fair", base=FairTask, fair_group="group", shared=False)(_count)


def publish(n: int, groups: int, fair_tasks: bool) -> None:
    """``n`` no-op tasks over ``groups`` groups, round robin, with ``delay()``."""
    task = fair if fair_tasks else plain
    for i in range(n):
        task.delay(f"g{i % groups}")


if __name__ == "__main__":
    started = time.perf_counter()
    publish(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "fair")
    # the publish loop's wall time, for the parent (the hold rate: start-up left out)
    print(f"published-in {time.perf_counter() - started:.6f}", flush=True)
