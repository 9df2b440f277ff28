"""The app ``python -m bench affinity`` runs as separate processes (``celery -A
bench.affinity_proj worker`` and ``... fair dispatch``), configured from the environment
(``AFF_*``, :func:`make_app`). Each task counts its run on the run's Redis."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import redis
from celery import Celery

from celery_fair import FairTask


def make_app(env: Mapping[str, str]) -> Celery:
    """Broker, results and store on ``AFF_BROKER``, namespace ``AFF_NS``, fair_affinity
    ``AFF_AFFINITY``, fair_affinity_spill_seconds ``AFF_SPILL`` (absent: never)."""
    ns = env["AFF_NS"]
    app = Celery("affinity", broker=env["AFF_BROKER"], set_as_current=False)
    app.conf.update(task_default_queue="q-" + ns, fair_key_prefix=ns,
                    task_ignore_result=True, worker_prefetch_multiplier=1,
                    worker_hijack_root_logger=False, broker_connection_retry_on_startup=True,
                    fair_affinity=env["AFF_AFFINITY"], fair_lease_seconds=5)
    if env.get("AFF_SPILL"):
        app.conf.fair_affinity_spill_seconds = float(env["AFF_SPILL"])
    counter = redis.Redis.from_url(env["AFF_BROKER"])

    def run(self: Any, tenant: str, sleep: float = 0.0) -> None:
        if sleep:
            import time

            time.sleep(sleep)
        counter.incr(f"{ns}:done")

    app.task(name="aff.run", base=FairTask, fair_group="tenant", bind=True,
             shared=False)(run)
    return app


app = make_app(os.environ) if os.environ.get("AFF_NS") else None
