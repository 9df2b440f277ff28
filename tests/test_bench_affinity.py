"""``python -m bench affinity`` runs (smoke size): the three drains end (off, on, on with
spill), and the moves the store counts on a leave and a join are the ones the hash
predicts."""

from __future__ import annotations

from bench.affinity import affinity
from bench.harness import Bench


def test_affinity_bench_runs_and_counts_the_hashed_moves() -> None:
    bench = Bench(smoke=True, reps=1)
    try:
        row = affinity(bench)
    finally:
        bench.close()
    assert row["off_per_s"]["median"] > 0 and row["on_per_s"]["median"] > 0
    assert row["ratio"]["median"] > 0 and row["spill_ratio"]["median"] > 0
    assert row["leave_moved"] == row["leave_hashed"] > 0, row
    assert row["join_moved"] == row["join_hashed"] > 0, row
