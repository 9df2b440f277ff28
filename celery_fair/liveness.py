"""Is a dispatcher running? What ``fair status``, ``fair check``, Flower and ``/metrics``
say about the dispatchers' heartbeats (written by ``heartbeat.py``).

Held work with no live dispatcher serving its queue never runs: every surface warns about
it in the same words and names the command that starts one, with the app as the user
named it (``celery -A <that> ...``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .store.base import DispatcherBeat, Store, now_ms
from .summary import format_wait


def app_name(app: Any) -> str:
    """The app as the user named it: the ``-A`` value of the running ``celery`` command
    (``fair status``, ``flower``, ``fair dispatch``), else the app's main module."""
    import click

    ctx = click.get_current_context(silent=True)
    given = ctx.find_root().params.get("app") if ctx is not None else None
    if isinstance(given, str) and given:
        return given
    main = getattr(app, "main", None)
    return main if main and main != "__main__" else "<your app module>"


def dispatch_command(app: str) -> str:
    """The command that starts a dispatcher of every fair queue of ``app``."""
    return f"celery -A {app} fair dispatch"


@dataclass(frozen=True)
class Liveness:
    """The live dispatchers, how many serve each fair queue, and the queues holding work
    that none serves (``unserved``: queue -> held)."""

    dispatchers: list[DispatcherBeat]
    serving: dict[str, int]
    unserved: dict[str, int]
    command: str
    now_ms: int

    def warnings(self) -> list[str]:
        """One sentence per queue with held work and no live dispatcher."""
        return [f"no live dispatcher for queue {queue} with {held} held: those tasks do "
                f"not run until one starts; start one with `{self.command}`"
                for queue, held in self.unserved.items()]

    @property
    def warning(self) -> str | None:
        """All the warnings as one text (None: nothing to warn about)."""
        return " ".join(self.warnings()) or None

    def of_queue(self, queue: str) -> dict[str, Any]:
        """``queue``'s ``dispatchers`` (the beats of those serving it) and ``warning``
        (None: it is served, or holds nothing), as ``fair status --json`` shows them."""
        held = self.unserved.get(queue)
        return {"dispatchers": [b.as_json() for b in self.dispatchers if b.serves(queue)],
                "warning": None if held is None else
                Liveness([], {}, {queue: held}, self.command, self.now_ms).warning}

    def as_json(self) -> dict[str, Any]:
        """``dispatchers`` (their beats) and ``warning``, as the JSON outputs show them."""
        return {"dispatchers": [b.as_json() for b in self.dispatchers],
                "warning": self.warning}

    def describe(self, beat: DispatcherBeat) -> str:
        """One line about a live dispatcher, for people."""
        queues = "every fair queue" if beat.every_queue else ", ".join(beat.queues) or "-"
        step = ("no step yet" if not beat.last_step_ms else
                f"last step {ago(self.now_ms - beat.last_step_ms)} ago")
        return (f"dispatcher {beat.host} pid {beat.pid} (app {beat.app}): up "
                f"{ago(self.now_ms - beat.started_ms)}, {step}, serves {queues}")


def read_liveness(store: Store, app: str, queues: Sequence[str] | None = None,
                  at_ms: int | None = None) -> Liveness:
    """The liveness of ``queues`` (default: every fair queue) in ``store``: one read of
    the beats and one of the queues' loads."""
    now = now_ms() if at_ms is None else at_ms
    beats = store.dispatchers(now)
    names = list(store.queues() if queues is None else queues)
    loads = store.loads(names)
    serving = serving_counts(beats, names)
    unserved = {q: loads[q][1] for q in names if not serving[q] and loads[q][1]}
    return Liveness(beats, serving, unserved, dispatch_command(app), now)


def serving_counts(beats: Sequence[DispatcherBeat], queues: Sequence[str]) -> dict[str, int]:
    """{queue: how many of the live dispatchers ``beats`` serve it}."""
    return {q: sum(b.serves(q) for b in beats) for q in queues}


def ago(ms: int) -> str:
    """How long ``ms`` is, for people (:func:`format_wait`)."""
    return format_wait(max(ms, 0) / 1000)


def utc(ms: int) -> str:
    """An epoch time in ms as ``2026-11-26 05:40:01 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))
