"""Test-only kill points for subprocess workers (``celery -A tests.proj``): a pool process
SIGKILLs itself at one moment of one task's end, once, so a test can strike the instant
between a task's body and its release that a random kill hits only by chance.

``FAIR_TEST_KILL_AT=<task id>:<point>`` in a worker's environment (tests/proj.py reads
it), points:

- ``release``: the body returned, its release not yet written ahead nor sent;
- ``store``: the release written ahead to the spool, its store call on its way;
- ``postrun``: the release landed (``FairTask.__call__``), Celery's ``task_postrun``
  runs, the message not yet acknowledged (``acks_late``).

"Once" is kept in the ledger's Redis, so the copy that runs after the kill lives.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from celery import signals

POINTS = ("release", "store", "postrun")


def install(spec: str, ledger: Any) -> None:
    """Arm the kill point ``spec`` (``<task id>:<point>``) in each pool process."""
    target, _, point = spec.rpartition(":")
    if point not in POINTS:
        raise ValueError(f"FAIR_TEST_KILL_AT: unknown point {point!r} (one of {POINTS})")

    def die_once() -> None:
        if ledger.r.set(ledger.key(f"killed:{target}"), 1, nx=True):
            os.kill(os.getpid(), signal.SIGKILL)

    @signals.worker_process_init.connect(weak=False)
    def arm(**_: Any) -> None:  # in the pool process only, never the main one
        if point in ("release", "store"):
            import celery_fair.task as fair_task_module
            from celery_fair.store.redis import RedisStore

            release, store_release = fair_task_module.release_dispatch, RedisStore.release
            ours = [False]  # the target's release under way in this process

            def release_dispatch(*args: Any, **kwargs: Any) -> None:
                ours[0] = kwargs.get("task_id") == target and bool(kwargs.get("done"))
                if ours[0] and point == "release":
                    die_once()
                release(*args, **kwargs)

            def on_its_way(self: Any, *args: Any, **kwargs: Any) -> Any:
                if ours[0] and point == "store":
                    die_once()
                return store_release(self, *args, **kwargs)

            fair_task_module.release_dispatch = release_dispatch  # type: ignore[assignment]
            RedisStore.release = on_its_way  # type: ignore[method-assign]
        else:
            @signals.task_postrun.connect(weak=False)
            def postrun(task_id: str | None = None, **_: Any) -> None:
                if task_id == target:
                    die_once()
