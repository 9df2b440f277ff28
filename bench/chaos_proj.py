"""The Celery app the chaos campaign runs: ``celery -A bench.chaos_proj worker|fair dispatch``.

Everything comes from the environment the campaign sets (``CHAOS_*``). The one task,
``chaos.work``, records its run in the PostgreSQL ledger (``bench/ledger.py``); a stale
duplicate the worker skips (celery-fair's ``Ignore``) is recorded from ``task_postrun``.

Test-only crash hook: in a dispatcher started with ``CHAOS_DISPATCH_KILL_P=p`` each message
has probability ``p`` of the dispatcher SIGKILLing itself between pick and publish, and
the same again between the broker's acceptance and the store's confirm. It patches the
dispatcher from outside (nothing in celery_fair knows about it).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from typing import Any

from celery import Celery, signals

from celery_fair import FairTask
from celery_fair.task import DISPATCH_HEADER, request_headers

from .ledger import Ledger

TASK = "chaos.work"


def create_app(broker: str, store: str, namespace: str, queue: str, ledger: Ledger,
               **conf: Any) -> Celery:
    app = Celery("chaos", broker=broker, set_as_current=False)
    app.conf.update(
        fair_store_url=store, fair_key_prefix=namespace, task_default_queue=queue,
        task_ignore_result=True, task_acks_late=True, task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None, worker_hijack_root_logger=False,
    )
    app.conf.update(conf)
    app.ledger = ledger  # type: ignore[attr-defined]

    @app.task(base=FairTask, fair_group="group", bind=True, shared=False, name=TASK)
    def work(self: Any, group: str, label: str, duration: float = 0.0) -> None:
        run = ledger.start(self.request.id, label, group)
        if duration:
            time.sleep(duration)
        ledger.end(run, group)

    @signals.task_postrun.connect(weak=False)
    def _skipped(task_id: str | None = None, task: Any = None, state: str | None = None,
                 **_: Any) -> None:
        if state == "IGNORED" and task_id and getattr(task, "name", None) == TASK:
            ledger.skipped(task_id, request_headers(task.request).get(DISPATCH_HEADER))

    return app


def environment(broker: str, store: str, namespace: str, queue: str, ledger: Ledger,
                conf: dict[str, Any]) -> dict[str, str]:
    """What a ``celery -A bench.chaos_proj`` subprocess needs to build the same app."""
    return {"CHAOS_BROKER": broker, "CHAOS_STORE": store, "CHAOS_NS": namespace,
            "CHAOS_QUEUE": queue, "CHAOS_PG": ledger.dsn, "CHAOS_SCHEMA": ledger.schema,
            "CHAOS_CONF": json.dumps(conf)}


def _install_crash_hook(probability: float) -> None:
    from celery_fair.publisher import KombuPublisher

    publish_one = KombuPublisher.publish_one

    def maybe_die() -> None:
        if random.random() < probability:
            os.kill(os.getpid(), signal.SIGKILL)

    def crashing_publish_one(self: KombuPublisher, *args: Any) -> bool:
        maybe_die()  # picked, not published: the pick lease brings it back
        accepted = publish_one(self, *args)
        if accepted:
            maybe_die()  # published, not confirmed: a stale copy the worker must skip
        return accepted

    KombuPublisher.publish_one = crashing_publish_one  # type: ignore[method-assign]


def _from_env() -> Celery | None:
    if not os.environ.get("CHAOS_BROKER"):
        return None
    env = os.environ
    ledger = Ledger(env["CHAOS_PG"], env["CHAOS_SCHEMA"])
    if env.get("CHAOS_DISPATCH_KILL_P"):
        _install_crash_hook(float(env["CHAOS_DISPATCH_KILL_P"]))
    return create_app(env["CHAOS_BROKER"], env["CHAOS_STORE"], env["CHAOS_NS"],
                      env["CHAOS_QUEUE"], ledger, **json.loads(env.get("CHAOS_CONF", "{}")))


app = _from_env()
