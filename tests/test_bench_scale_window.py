"""The scale benchmark's measuring window (bench/scale.py ``Measure.window``): when every
task moved before its first look, it measures from the start instead of waiting for more
than all of them (a CI smoke run waited 300 s with 600 of 600 counted)."""

from __future__ import annotations

import time
from typing import Any

from bench.scale import Measure


class _Quiet(Measure):
    """A window over a count given by the test: no processes, no CPU to read."""

    def __init__(self) -> None:
        self.procs: dict[str, Any] = {}

    def cpu(self) -> dict[str, float]:
        return {"store": time.process_time()}


def test_a_window_whose_tasks_all_moved_before_its_first_look_measures_from_the_start():
    counts = iter([0, 600, 600, 600])  # the start, then everything at once
    started = time.monotonic()
    figures = _Quiet().window(lambda: next(counts), 600)
    assert time.monotonic() - started < 5
    assert figures["per_s"] > 0
