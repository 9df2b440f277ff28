"""Writes docs/benchmarks.md and docs/fairness-timeline.png from bench/results/."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from .harness import RESULTS, machine

DOCS = Path(__file__).parent.parent / "docs"


def _fmt(value: Any) -> str:
    if isinstance(value, dict) and "median" in value:
        parts = [f"{value['median']:,.4g}"]
        if "min" in value:
            parts.append(f"({value['min']:,.4g}–{value['max']:,.4g})")
        return " ".join(parts)
    if isinstance(value, dict):
        return "<br>".join(f"{k}: {_fmt(v)}" for k, v in value.items())
    if isinstance(value, float):
        return f"{value:,.4g}"
    return str(value)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_report() -> str:
    """Render the last run's results; returns the path written."""
    lines = (RESULTS / "latest.jsonl").read_text(encoding="utf-8").splitlines()
    results = [json.loads(line) for line in lines if line.strip()]
    info = machine()
    out = ["# Benchmarks", "",
           "Each scenario runs plain Celery and celery-fair in the same run on the same "
           "Redis and real Celery workers; compare the ratios, not absolute rates (this "
           "machine's run-to-run spread is ±20–30 %). Figures are the median over the "
           "repetitions, with (min–max).", "",
           f"Commit `{_commit()}`; {info['cpus']} CPUs ({info['cpu']}), Python "
           f"{info['python']}, Celery {info['celery']}, kombu {info['kombu']}, redis-py "
           f"{info['redis_py']}, {info['os']}.", "",
           "Reproduce: `python -m bench all && python -m bench report` "
           "(`--quick` for a smaller run).", "",
           "| scenario | target | met | figures |", "|---|---|---|---|"]
    for row in results:
        figures = {k: v for k, v in row.items()
                   if k not in ("scenario", "quick", "target", "met")}
        quick = " (quick)" if row.get("quick") else ""
        out.append(f"| {row['scenario']}{quick} | {row['target']} | "
                   f"{'yes' if row['met'] else '**no**'} | {_fmt(figures)} |")
    chart = _timeline_chart()
    if chart:
        out += ["", "## Fairness timeline", "",
                "Task starts after tenant B enqueues 10 tasks behind tenant A's 2,000 "
                "(20 ms tasks, 4 worker slots): plain Celery runs B last; celery-fair "
                "interleaves B at once.", "", f"![timeline]({chart.name})"]
    DOCS.mkdir(exist_ok=True)
    path = DOCS / "benchmarks.md"
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return str(path)


def _timeline_chart() -> Path | None:
    source = RESULTS / "timeline.json"
    if not source.exists():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(source.read_text(encoding="utf-8"))
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.5), sharex=False)
    for ax, mode, title in zip(axes, ("fifo", "fair"), ("plain Celery (FIFO)", "celery-fair")):
        rows = data.get(mode, [])
        for tenant, colour, y in (("A", "#9aa5b1", 0), ("B", "#d9480f", 1)):
            xs = [t for who, t in rows if who == tenant and t > -0.5]
            ax.scatter(xs, [y] * len(xs), s=6, c=colour, label=f"tenant {tenant}")
        ax.set_yticks([0, 1], ["A", "B"])
        ax.set_title(title, fontsize=10, loc="left")
        ax.axvline(0, color="black", linewidth=0.5)
    axes[-1].set_xlabel("seconds after B enqueued its 10 tasks")
    fig.tight_layout()
    path = DOCS / "fairness-timeline.png"
    DOCS.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
