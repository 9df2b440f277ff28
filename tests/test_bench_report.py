"""docs/benchmarks.md's figures: the fairness timeline puts plain Celery and celery-fair
on one time axis (issue 17: two x scales hid how much later plain Celery starts tenant B)."""

from __future__ import annotations

import json

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


AFFINITY_ROW = {
    "scenario": "affinity", "store": "redis", "quick": True, "met": True,
    "target": "ratio >= 0.9; moves as hashed", "tasks": 2000, "workers": 3, "pool": 4,
    "off_per_s": {"min": 700.0, "median": 723.0, "max": 750.0},
    "on_per_s": {"min": 600.0, "median": 664.0, "max": 800.0},
    "ratio": {"min": 0.87, "median": 0.918, "max": 1.07}, "spill": 1.0,
    "spill_per_s": {"min": 650.0, "median": 700.0, "max": 760.0},
    "spill_ratio": {"min": 0.9, "median": 0.968, "max": 1.01},
    "busiest_worker_groups": 0.36, "groups": 120, "load_before": 4.4,
    "leave_moved": 34, "leave_hashed": 34, "join_moved": 34, "join_hashed": 34}


def test_the_affinity_figures_get_a_section_of_their_own(tmp_path, monkeypatch) -> None:
    """`python -m bench affinity`'s row (controls.jsonl) becomes docs/benchmarks.md's
    "Affinity" section: the ratio on/off and the moves on a leave and a join; it is no
    longer a row of the rate limits' table. bench/results is looked up at the call."""
    from bench import harness
    from bench.report import _controls_section, _rate_lines
    from bench.report_affinity import affinity_lines

    monkeypatch.setattr(harness, "RESULTS", tmp_path)
    assert affinity_lines() == []  # no results: the report keeps what it had
    kept = _controls_section("## Affinity\n\nas it was\n\n## By hand\n\nkept\n")
    assert kept == ["## Affinity", "", "as it was", "", "## By hand", "", "kept"]
    rate = dict(AFFINITY_ROW, scenario="rate", window_s=60)
    lines = [json.dumps(rate), json.dumps(AFFINITY_ROW)]
    (tmp_path / "controls.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    section = affinity_lines()
    assert section[0] == "## Affinity"
    text = "\n".join(section)
    assert "| ratio on / off (no spill: at most ~0.93 here) | 0.918 (0.870–1.070) |" in text
    assert "| ratio on with spill / off (target ≥ 0.9) | 0.968 (0.900–1.010) |" in text
    assert "| tasks/s, affinity on | 664 (600–800) |" in text
    assert "| a worker leaves: groups moved (hash predicts) | 34 (34) of 120 |" in text
    assert "| a worker joins: groups moved (hash predicts) | 34 (34) of 120 |" in text
    assert "| target ratio >= 0.9; moves as hashed | met |" in text
    assert "load average 4.4 before the run" in text
    table = "\n".join(_rate_lines())
    assert "| rate " in table and "| affinity " not in table
    assert "## Affinity" in _controls_section("")
