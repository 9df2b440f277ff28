"""The app ``python -m bench scale`` runs as separate processes (``celery -A
bench.scale_proj fair dispatch --shard i/n`` and ``... worker``), configured from the
environment (``SCALE_*``, :func:`make_app`). Each task counts its run on a redis-server of
its own, outside the measure."""

from __future__ import annotations

import os
from collections.abc import Mapping

import redis
from celery import Celery

from celery_fair import FairTask


def make_app(env: Mapping[str, str]) -> Celery:
    """The app of one measure: broker ``SCALE_BROKER``, store ``SCALE_STORE`` (else the
    broker's Redis), namespace ``SCALE_NS``, direct push when ``SCALE_DIRECT`` is 1; with
    ``SCALE_HELD`` 1 nothing caps or reclaims a dispatch (no worker begins them)."""
    ns = env["SCALE_NS"]
    app = Celery("scale", broker=env["SCALE_BROKER"], set_as_current=False)
    app.conf.update(fair_key_prefix=ns, task_ignore_result=True,
                    worker_prefetch_multiplier=1, worker_hijack_root_logger=False,
                    broker_connection_retry_on_startup=True,
                    fair_direct_push=env.get("SCALE_DIRECT") == "1")
    if env.get("SCALE_STORE"):
        app.conf.fair_store_url = env["SCALE_STORE"]
    if env.get("SCALE_HELD") == "1":  # as the dispatch scenario (bench/throughput.py)
        app.conf.update(fair_max_inflight=10**9, fair_batch_size=500,
                        fair_lease_seconds=3600)
    counter = redis.Redis.from_url(env["SCALE_COUNTER"])
    key = ns + ":done"

    def count(group: str) -> None:
        counter.incr(key)

    app.task(name="scale.fair", base=FairTask, fair_group="group", shared=False)(count)
    return app


app = make_app(os.environ) if "SCALE_NS" in os.environ else None
