"""docs/benchmarks.md's figures: the fairness timeline puts plain Celery and celery-fair
on one time axis (issue 17: two x scales hid how much later plain Celery starts tenant B)."""

from __future__ import annotations

import matplotlib

from bench.report import timeline_figure

matplotlib.use("Agg")


def test_the_timeline_shows_fifo_and_fair_on_one_time_axis() -> None:
    import matplotlib.pyplot as plt

    fifo = [["A", i * 0.02] for i in range(2000)] + [["B", 40.0 + i * 0.02] for i in range(10)]
    fair = [["A", i * 0.02] for i in range(40)] + [["B", 0.01 + i * 0.04] for i in range(10)]
    fig = timeline_figure({"fifo": fifo, "fair": fair})
    try:
        plain, ours = fig.axes
        assert plain.get_xlim() == ours.get_xlim()
        assert ours.get_xlim()[1] >= 40.0  # fair's panel spans FIFO's 40 s too
    finally:
        plt.close(fig)
