"""What the admin page shows, read from the store of the project's Celery app.

The app is the one Celery's Django recipe makes current: the project's ``__init__.py``
imports it (``from .celery import app as celery_app``), so it is
:data:`celery.current_app` in every process that loaded Django's settings. The figures
are read from the store when the page loads (no dispatcher needed: a support engineer
may be looking precisely because none runs); the capacity is the dispatcher's own, from
the summary it keeps, when one runs.
"""

from __future__ import annotations

import time
from typing import Any

from celery import current_app

from ...liveness import app_name, read_liveness
from ...store import store_for
from ...summary import build_summary, format_wait, read_summaries

#: Most groups listed per queue (the busiest; the totals count every group).
GROUP_LIMIT = 100


def celery_app() -> Any:
    """The project's Celery app (see the module docstring)."""
    return current_app._get_current_object()


def read_queues(app: Any, limit: int = GROUP_LIMIT) -> list[dict[str, Any]]:
    """Every fair queue of ``app``: :func:`~celery_fair.summary.build_summary`'s document
    read now, with the dispatcher's capacity (None when no dispatcher runs), the live
    dispatchers serving it and, with held work and none, the warning naming the command
    that starts one (``liveness.py``), and each group's figures as the page writes them.

    Raises:
        FairError: the store could not be read.
    """
    store = store_for(app)
    live = read_summaries(store)
    now = time.time()
    names = store.queues()
    liveness = read_liveness(store, app_name(app), names)
    queues = []
    for queue in names:
        summary = live.get(queue)
        capacity = None if summary is None else summary["capacity"]
        doc = build_summary(store, queue, capacity, now=now, limit=limit)
        doc["held"] = doc["held_interactive"] + doc["held_background"]
        doc["dispatcher"] = summary is not None
        doc.update(liveness.of_queue(queue))
        for group in doc["groups"]:
            group["cap_text"] = "∞" if group["cap"] is None else str(group["cap"])
            group["weight_text"] = f"{group['weight']:g}"
            group["oldest_wait_text"] = format_wait(group["oldest_wait"])
            group["limited_text"] = ", ".join(group["limited"]) or "-"
        queues.append(doc)
    return queues
