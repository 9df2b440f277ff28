"""What a replay shows (``fair simulate``): per group its waits (p50, p99, longest) and its
share of worker time while every group still had work to start (the *contended* part of
the run: until the first group's last task started; the shares of the whole run only
repeat the trace's totals); per run the Jain index of those shares, the utilization of
the slots and the longest wait; and a plot of each group's waits over time."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from .engine import Run

__all__ = ["GroupFigures", "RunFigures", "figures", "plot", "render"]


@dataclass(frozen=True)
class GroupFigures:
    group: str
    tasks: int
    started: int
    wait_p50: float
    wait_p99: float
    wait_max: float
    worker_share: float  # of the worker time used while every group had work to start


@dataclass(frozen=True)
class RunFigures:
    policy: str
    charge: str
    slots: int
    groups: list[GroupFigures]
    jain: float  # of the groups' worker-time shares: 1 when equal
    utilization: float  # busy slot time / (slots x makespan)
    longest_wait: float
    makespan: float  # first publication to last end, seconds

    def as_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def figures(run: Run) -> RunFigures:
    waits: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    last_start: dict[str, float] = {}
    busy, ends = 0.0, []
    for group, at, start, duration in run.tasks:
        counts[group] += 1
        if start is not None:
            waits[group].append(start - at)
            last_start[group] = max(last_start.get(group, start), start)
            busy += duration
            ends.append(start + duration)
    first = min((at for _, at, _, _ in run.tasks), default=0.0)
    makespan = (max(ends) - first) if ends else 0.0
    work = _contended_work(run, first, min(last_start.values(), default=first))
    total = sum(work.values())
    shares = [work.get(g, 0.0) / total if total else 0.0 for g in counts]
    jain = (sum(shares) ** 2 / (len(shares) * sum(s * s for s in shares))
            if any(shares) else 1.0)
    rows = [GroupFigures(g, counts[g], len(waits[g]), _percentile(waits[g], 50),
                         _percentile(waits[g], 99), max(waits[g], default=0.0),
                         work.get(g, 0.0) / total if total else 0.0) for g in sorted(counts)]
    return RunFigures(run.policy, run.charge, run.slots, rows, jain,
                      busy / (run.slots * makespan) if makespan else 0.0,
                      max((r.wait_max for r in rows), default=0.0), makespan)


def _contended_work(run: Run, first: float, until: float) -> dict[str, float]:
    """Each group's worker time within [first, until] (the whole run when that is empty:
    one group, or one that never waited)."""
    if until <= first:
        until = float("inf")
    work: dict[str, float] = defaultdict(float)
    for group, _, start, duration in run.tasks:
        if start is not None:
            work[group] += max(0.0, min(start + duration, until) - max(start, first))
    return work


def render(runs: list[RunFigures]) -> Any:
    """One rich table per run."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    for f in runs:
        what = "policy " + _described(f.policy, f.charge)
        parts.append(Text(f"{what}, {f.slots} slots: Jain "
                          f"{f.jain:.3f}, utilization {f.utilization:.0%}, longest wait "
                          f"{f.longest_wait:.2f}s, makespan {f.makespan:.2f}s"))
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for name in ("group", "tasks", "wait p50", "wait p99", "longest",
                     "worker time (contended)"):
            table.add_column(name, justify="left" if name == "group" else "right")
        for g in f.groups:
            never = "" if g.started == g.tasks else f" ({g.tasks - g.started} never ran)"
            table.add_row(g.group, f"{g.tasks}{never}", f"{g.wait_p50:.2f}s",
                          f"{g.wait_p99:.2f}s", f"{g.wait_max:.2f}s", f"{g.worker_share:.1%}")
        parts.append(table)
    return Group(*parts)


def plot(runs: list[Run], path: str) -> None:
    """Each group's waits against publication time, one panel per run, same axes."""
    try:
        import matplotlib
    except ImportError:
        from .engine import BadSimulation

        raise BadSimulation("--plot needs matplotlib: pip install 'celery-fair[simulate]'"
                            ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.6 * len(runs)), sharex=True,
                             sharey=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        by_group: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for group, at, start, _ in run.tasks:
            if start is not None:
                by_group[group].append((at, start - at))
        for group, points in sorted(by_group.items()):
            ax.scatter([p[0] for p in points], [p[1] for p in points], s=4, label=group)
        ax.set_title(_described(run.policy, run.charge), fontsize=10, loc="left")
        ax.set_ylabel("wait (s)")
    axes[-1, 0].set_xlabel("published at (s)")
    axes[0, 0].legend(loc="upper left", fontsize=8, markerscale=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _described(policy: str, charge: str) -> str:
    """A run's policy in words: only wfq and smallest charge a share (fifo and harmony
    charge none)."""
    if policy == "fifo":
        return "fifo (plain Celery: one queue)"
    if policy == "harmony":
        return "harmony (fewest in flight first)"
    return f"{policy}, charge {charge}"
