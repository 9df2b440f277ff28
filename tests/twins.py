"""Twin tasks: the same task fair and plain, so a test can compare celery-fair with Celery.

``twin.echo`` (fair) and ``twin.plain_echo`` (plain Celery) return what the worker saw of
their message: arguments, delivery info, custom headers, time limits, shadow name. A test
runs the same call through both and asserts the answers and final states are equal.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

from celery_fair import FairTask
from celery_fair.task import store_for

#: Headers celery_fair adds; the only difference allowed between the twins' answers.
FAIR_FIELDS = ("fair_group", "fair_class", "fair_cost", "fair_dispatch_id", "fair_queue",
               "fair_lease_until")
CUSTOM_FIELDS = ("x_trace", "tenant_hint")


def describe(request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """What a task sees of its own message (JSON-safe)."""
    info = request.delivery_info or {}
    return {
        "args": list(args), "kwargs": dict(kwargs),
        "priority": info.get("priority"), "routing_key": info.get("routing_key"),
        "exchange": info.get("exchange"),
        "timelimit": list(request.timelimit or ()) or None,
        "shadow": getattr(request, "shadow", None),
        "custom": {k: getattr(request, k, None) for k in CUSTOM_FIELDS},
        "expires": bool(request.expires), "eta": bool(request.eta),
    }


def register(app: Celery) -> tuple[Any, Any]:
    """Register the twins on ``app`` (before a worker starts); returns (fair, plain)."""
    ledger = app.ledger  # type: ignore[attr-defined]

    def echo(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        ledger.enter("twins", str(args[0]) if args else "")
        ledger.leave("twins")
        return describe(self.request, args, kwargs)

    fair = app.task(base=FairTask, bind=True, shared=False, name="twin.echo",
                    fair_group=lambda a, k: "twins")(echo)
    plain = app.task(bind=True, shared=False, name="twin.plain_echo")(echo)
    return fair, plain


def nap(seconds: float) -> str:
    """Sleep; a soft time limit cuts it short (SoftTimeLimitExceeded raised in the task)."""
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        return "soft limit"
    return "slept"


def queue_of(app: Celery) -> str:
    return str(app.conf.task_default_queue)


def settled(app: Celery, queue: str | None = None) -> bool:
    """Nothing held, delayed or in flight on the fair queue."""
    snap = store_for(app).snapshot(queue or queue_of(app))
    return snap["inflight"] == 0 and snap["delayed"] == 0 and not snap["groups"]


def now_ms() -> int:
    return int(time.time() * 1000)
