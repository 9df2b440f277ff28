"""The demo's report: per tenant and mode, when its first task started and its last ended."""

from __future__ import annotations

import json
from typing import Any

from .run import BIG_TENANT, CONCURRENCY, FAIR, FIFO, TASK_SECONDS, Batch, Run


def figures(batches: list[Batch], runs: list[Run], scale: float) -> dict[str, Any]:
    """Everything the demo measured, as one JSON-able object."""
    rows = [_row(batch, runs) for batch in batches]
    small = [r for r in rows if r["tenant"] != BIG_TENANT and r["kind"] == "background"]
    worst = {m: max(r[m]["first_start"] for r in small) for m in (FIFO, FAIR)}
    speedup = worst[FIFO] / max(worst[FAIR], 0.001)
    return {
        "scale": scale, "concurrency": CONCURRENCY, "task_seconds": TASK_SECONDS,
        "runs": {run.mode: {"seconds": round(run.seconds, 3),
                            "tasks": sum(b.count for b in batches)} for run in runs},
        "tenants": rows,
        "small_tenants_worst_first_start": {**{m: round(v, 3) for m, v in worst.items()},
                                            "speedup": round(speedup, 1)},
        "takeaway": takeaway(rows, worst, speedup),
    }


def _row(batch: Batch, runs: list[Run]) -> dict[str, Any]:
    row: dict[str, Any] = {"tenant": batch.tenant, "kind": batch.kind, "label": batch.label,
                           "tasks": batch.count}
    row.update((run.mode, run.timings[batch.label].as_dict()) for run in runs)
    return row


def takeaway(rows: list[dict[str, Any]], worst: dict[str, float], speedup: float) -> str:
    big = next(r for r in rows if r["tenant"] == BIG_TENANT)
    waits = f"worst wait {worst[FIFO]:.2f}s -> {worst[FAIR]:.2f}s"
    if speedup >= 1.05:
        how = f"{speedup:.0f}x" if speedup >= 10 else f"{speedup:.1f}x"
        lead = f"With celery-fair, small tenants started {how} sooner ({waits})"
    else:
        lead = f"This time small tenants did not start sooner with celery-fair ({waits})"
    return (f"{lead}, while {BIG_TENANT} finished in {big[FAIR]['done']:.1f}s instead of "
            f"{big[FIFO]['done']:.1f}s.")


HEADERS = ("tenant", "tasks", "first start FIFO", "first start fair", "done FIFO", "done fair")


def table_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    return [(r["label"], str(r["tasks"]), f"{r[FIFO]['first_start']:.2f}s",
             f"{r[FAIR]['first_start']:.2f}s", f"{r[FIFO]['done']:.2f}s",
             f"{r[FAIR]['done']:.2f}s") for r in report["tenants"]]


def render_plain(report: dict[str, Any]) -> str:
    rows = [HEADERS, *table_rows(report)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w)
                       for i, (cell, w) in enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + ["", report["takeaway"]])


def print_report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(render_plain(report))
        return
    table = Table(title=f"Seconds after enqueueing began ({CONCURRENCY} worker threads, "
                        f"{TASK_SECONDS * 1000:.0f} ms tasks)")
    for i, header in enumerate(HEADERS):
        table.add_column(header.replace(" F", "\nF").replace(" f", "\nf"),
                         justify="left" if i == 0 else "right")
    for row in table_rows(report):
        table.add_row(*row)
    console = Console()
    console.print(table)
    console.print(f"[bold]{report['takeaway']}[/bold]")
