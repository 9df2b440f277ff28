"""Writes docs/benchmarks.md and docs/fairness-timeline.png from bench/results/."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from . import harness
from .harness import commit, machine

DOCS = Path(__file__).parent.parent / "docs"

#: What each scenario measures, in the words of the report.
WHAT = {
    "hold": "`delay()` of a fair task vs plain `delay()` (no workers), tasks/s",
    "dispatch": "the dispatcher alone moving 20,000 held tasks into the real queue, "
                "dispatches/s (direct push; kombu batch; plain kombu publish for scale)",
    "end_to_end": "no-op tasks (`tasks`) drained by the same worker (threads, 8), fair "
                  "vs plain, tasks/s",
    "idle_latency": "enqueue → task start on an idle system, ms (200 samples per run)",
    "small_tenant": "B's first start after B enqueues 10 tasks behind A's backlog (20 ms "
                    "tasks, 4 slots), in task durations",
    "share": "10 backlogged groups of equal weight (Jain index); weights 1:2:4 (largest "
             "share error, percentage points)",
    "groups": "store pick rate with 10, 1,000 and 100,000 backlogged groups, picks/s",
    "pick_groups": "store pick rate with 10 and 10,000 backlogged groups under each policy "
                   "(wfq; harmony_: Harmony), picks/s",
    "held": "Redis memory per held task vs the stored message itself, bytes",
}


#: What limits a scenario when it misses its target (profiled; see the issue's notes).
LIMITS = {
    "end_to_end": (
        "CPU per task on 2 shared cores (here the worker runs inside the benchmark "
        "process; `python -m bench cpu` runs every part as its own process and splits "
        "the CPU by process, see \"CPU per task\" and \"Issue 17: before and after\"). "
        "The dispatcher has left the per-task path (releases refill their slots); what "
        "fair adds is Redis (the hold and the release scripts, the release picking and "
        "pushing the next message: ~100 µs of each task's Redis time is the scripts "
        "defining their includes' functions on every call) and the worker's `begin` and "
        "`release` round trips (`fair_quick_start` saves the `begin`)."),
    "dispatch": (
        "One Redis core: the pick script costs ~100 µs of Redis per message here (~11 "
        "commands, the record with the message, the lease, kombu's message built in "
        "Lua). The host's speed moves it too: 14,115/s on 2026-11-22, 8,408 on "
        "2026-11-25 (`7a3fe78`), ~10,200 now."),
    "idle_latency": (
        "A hold into an idle queue picks and pushes its message in the same script, so "
        "what is added is that script, the worker's `begin` (none with "
        "`fair_quick_start`) and its release; the spread between runs (±0.4 ms) is "
        "the machine's."),
    "small_tenant": (
        "The ratio of the two backlogs (1.52 against 1.5): the 4 slots run in lockstep, "
        "so a newcomer waits for the running burst's end, anything from 0 to 1.2 task "
        "durations; both medians are under 1 task duration."),
    "groups": (
        "Per group taken from, a pick writes the group's in-flight count, its tags and "
        "head times, and its backlog rank (3 commands): with one message from each of "
        "500 groups a pick makes ~3 commands per message more than with 50 from each of "
        "10. A layout with those fields in per-queue hashes written once per call is "
        "the next step (issue 12)."),
    "pick_groups": "As for groups: the per-group writes of a pick (issue 12).",
    "held": (
        "The message's entry in the queue's hash and its id in its group's list "
        "(~210 B besides the message, 209 at `7a3fe78`); a finished task leaves ~25 B "
        "(its tombstone in a bucketed hash)."),
}


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"


def _fmt(value: Any) -> str:
    if isinstance(value, dict) and "median" in value:
        text = _number(value["median"])
        if "min" in value and value["min"] != value["max"]:
            text += f" ({_number(value['min'])}–{_number(value['max'])})"
        return text
    if isinstance(value, dict):
        return "<br>".join(f"{k}: {_fmt(v)}" for k, v in value.items())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number(value)
    return str(value)


def _figures(row: dict[str, Any]) -> str:
    figures = {k: v for k, v in row.items()
               if k not in ("scenario", "store", "quick", "target", "met")}
    return "<br>".join(f"{k}: {_fmt(v)}" for k, v in figures.items())


def _run_info() -> dict[str, Any]:
    path = harness.RESULTS / "run.json"
    if path.exists():
        info: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return info
    return {"commit": commit(), "machine": machine()}


#: Where the SQL stores' section begins in docs/benchmarks.md.
SQL_MARK = "<!-- SQL stores: generated from bench/results/latest-<store>.jsonl -->"
#: Where the controls' section (rate limits) begins: run apart (``python -m bench rate``).
CONTROLS_MARK = "<!-- controls: generated from bench/results/controls.jsonl -->"


def write_report() -> str:
    """Render the last runs' results into docs/benchmarks.md: the Redis part from
    latest.jsonl, the SQL stores' from latest-<store>.jsonl; a part without results keeps
    its text from the file (they are run apart). Returns the path written."""
    from .report_sql import sql_section

    path = DOCS / "benchmarks.md"
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    old_main, _, old_sql = old.partition(SQL_MARK)
    old_redis, _, old_controls = old_main.partition(CONTROLS_MARK)
    redis_part = _redis_report() if (harness.RESULTS / "latest.jsonl").exists() else \
        old_redis.rstrip("\n").split("\n")
    controls_part = _controls_section(old_controls)
    sql_part = sql_section() or old_sql.strip("\n").split("\n")
    out = redis_part + (["", CONTROLS_MARK, "", *controls_part] if any(controls_part)
                        else []) + (["", SQL_MARK, "", *sql_part] if any(sql_part) else [])
    DOCS.mkdir(exist_ok=True)
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return str(path)


def _latest_rows(path: Path) -> list[dict[str, Any]]:
    """The last row of each scenario in a results file (a scenario run again replaces
    its row)."""
    latest: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            latest.pop(row["scenario"], None)
            latest[row["scenario"]] = row
    return list(latest.values())


def _controls_section(old: str = "") -> list[str]:
    """Rate limits (``python -m bench rate``) from controls.jsonl, the CPU per task
    (``python -m bench cpu``) from cpu.jsonl and the scaling over Redis Cluster (``python
    -m bench scale``) from scale.jsonl, bulk holding (``python -m bench bulk``) from
    bulk.jsonl, affinity (``python -m bench affinity``) from controls.jsonl. Each is run
    apart: one without its results file keeps its subsection of ``old`` (the controls'
    part of the file as it was)."""
    from .bulk import TITLE as BULK_TITLE
    from .bulk import bulk_lines
    from .report_affinity import TITLE as AFFINITY_TITLE
    from .report_affinity import affinity_lines
    from .report_scale import TITLE, scale_lines

    kept = _subsections(old)
    out: list[str] = []
    generated = (("## Rate limits", _rate_lines()), ("## CPU per task", _cpu_lines()),
                 (TITLE, scale_lines()), (BULK_TITLE, bulk_lines()),
                 (AFFINITY_TITLE, affinity_lines()))
    for title, lines in generated:
        part = _strip_blank(lines) or kept.get(title, [])
        out += ([""] if out and part else []) + part
    # a subsection written by hand (no results file of its own) stays, after them
    for title, part in kept.items():
        if title not in dict(generated) and part:
            out += ([""] if out else []) + part
    return out


def _subsections(text: str) -> dict[str, list[str]]:
    """The ``## `` subsections of ``text`` by their heading line, each its lines."""
    parts: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.split("\n"):
        if line.startswith("## "):
            current = parts.setdefault(line.strip(), [])
        if current is not None:
            current.append(line)
    return {title: _strip_blank(lines) for title, lines in parts.items()}


def _strip_blank(lines: list[str]) -> list[str]:
    """``lines`` without blank lines at either end."""
    text = "\n".join(lines).strip("\n")
    return text.split("\n") if text else []


def _cpu_lines() -> list[str]:
    path = harness.RESULTS / "cpu.jsonl"
    if not path.exists():
        return []
    # one row per way of running
    latest: dict[tuple[str, bool, bool, int], dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            latest[(row.get("broker", "redis"), row["published_first"], row["hiredis"],
                    row["groups"])] = row
    out = ["", "## CPU per task", "",
           "`python -m bench cpu [--published-first] [--no-hiredis] [--groups N]`: 10,000 no-op "
           "tasks over 10 groups (or N), every part a process of its own (the publisher's "
           "`delay()` loop, one threads worker `-c 8` with prefetch 1, the dispatcher, the "
           "redis-server that is broker and store); µs of CPU per task of each process, plain "
           "Celery and celery-fair one after the other in the same run (`fair@REV`: celery-fair "
           "as of that commit, `--baseline REV`; `fair+quick`: with `fair_quick_start`, "
           "`--quick-start`; RabbitMQ broker: `--broker amqp`, its CPU beside Redis's, in the "
           "total). The load average before the run is given: on a loaded 2-core machine the "
           "rates (tasks/s) swing much more than the CPU per task. `publish/s`: the publisher's "
           "`delay()` loop alone (its start-up left out), while the worker and dispatcher drain "
           "(or, published first, with nothing consuming); `hold ratio`: fair over plain (target"
           " ≥ 1.0 both ways).", "",
           "| way | side | app | redis | worker | dispatcher | total | tasks/s | added "
           "| drain ratio | publish/s | hold ratio |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (broker, first, hiredis, groups), row in sorted(latest.items()):
        way = ("published first" if first else "while draining") + \
            (", hiredis" if hiredis else ", no hiredis") + \
            (", 1 group" if groups == 1 else f", {groups} groups") + \
            (", RabbitMQ broker" if broker == "amqp" else "") + \
            (f", load {row['load_before']:.1f}" if "load_before" in row else "")
        for side in [k for k in row if k == "plain" or k.startswith("fair")]:
            cpu = row[side]["us_cpu_per_task"]
            tail = " | " if side == "plain" else \
                f"{row['added_us_per_task'][side]:,} | {row['drain_ratio'][side]}"
            published = row[side].get("published_per_s")  # rows before it have none
            tail += f" | {published:,.0f} | " if published else " | – | "
            tail += str(row.get("hold_ratio", {}).get(side, "")) if published else ""
            store = f"{cpu['redis']:,}" + (f" + RabbitMQ {cpu['rabbitmq']:,}"
                                           if "rabbitmq" in cpu else "")
            out.append(f"| {way} (`{row['commit']}`) | {side} | {cpu['app']:,} | "
                       f"{store} | {cpu['worker']:,} | {cpu['dispatcher']:,} | "
                       f"{cpu['total']:,} | {row[side]['tasks_per_s']:,.0f} | {tail} |")
    return out


def _rate_lines() -> list[str]:
    path = harness.RESULTS / "controls.jsonl"
    if not path.exists():
        return []
    out = ["## Rate limits", "",
           "`python -m bench rate` (`--quick`: a 20 s window). A group limited to 10/s "
           "(`fair limit --rate 10/s`) with a backlog, beside two unlimited groups of "
           "10 ms tasks on 4 worker slots; after a second of warm-up, the starts of each "
           "group are counted from inside the tasks over the window. The other groups' "
           "count is compared with a window of the same length in the same run without "
           "the limited group. `python -m bench charge` (`fair_charge`): two backlogged "
           "groups of 10 ms and 100 ms tasks on 4 slots, the same declared cost; each "
           "group's worker time (its starts in the window times its task's length) "
           "under `runtime` and under `count`, the share error relative to an equal "
           "share. `python -m bench aging` (`fair_policy` 'smallest'): one group fed 300 "
           "tasks/s of cost 1 and 2/s of cost 20 (all 20 ms) on 4 slots; the longest wait "
           "of the big tasks with `fair_aging_seconds` 0.05 against the stated bound (the "
           "start of the first task held c·A after each, measured inside the tasks) and "
           "without aging (1000 s).", "",
           "| scenario | when | target | met | figures |", "|---|---|---|---|---|"]
    # affinity's row has a section of its own (report_affinity.py)
    rows = [row for row in _latest_rows(path) if row["scenario"] != "affinity"]
    if not rows:
        return []
    for row in rows:
        when = time.strftime("%Y-%m-%d", time.gmtime(path.stat().st_mtime))
        out.append(f"| {row['scenario']}{' (quick)' if row.get('quick') else ''} | {when} "
                   f"| {row['target']} | {'yes' if row['met'] else '**no**'} | "
                   f"{_figures(row)} |")
    return out


def _redis_report() -> list[str]:
    """The Redis store's part: the run, the results, missed targets, the timeline."""
    results = _latest_rows(harness.RESULTS / "latest.jsonl")
    run = _run_info()
    info = run["machine"]
    out = ["# Benchmarks", "",
           "`python -m bench all && python -m bench report` (add `--quick` for a smaller "
           "run, `--reps N` for more repetitions). Every scenario runs on its own "
           "redis-server with real Celery workers (in-process, threads pool) and measures "
           "plain Celery in the same run where there is a comparison: read the ratios, "
           "not the absolute rates. Figures are the median over the repetitions, with "
           "(min–max).", "",
           "## The run", "",
           f"- Measured on commit `{run['commit']}`"
           + (f", {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(run['started']))}, "
              f"{run['seconds'] // 60} min {run['seconds'] % 60} s"
              if "started" in run else "") + ".",
           f"- Machine: {info['cpus']} CPUs ({info['cpu']}), {info['os']}; Python "
           f"{info['python']}, Celery {info['celery']}, kombu {info['kombu']}, redis-py "
           f"{info['redis_py']} ({info.get('hiredis', 'hiredis not recorded')}).",
           ]
    if "load_before" in run:
        load = (f"load average {run['load_before'][0]:.1f} before, "
                f"{run['load_after'][0]:.1f} after, on {info['cpus']} CPUs")
        # Before: what else ran (after includes the benchmark's own load).
        if run["load_before"][0] > int(info["cpus"]) / 2:
            out.append(
                f"- **A noisy machine**: it was shared with other jobs during the run "
                f"({load}). Absolute rates swing by 2-5x between repetitions here; the "
                f"ratios, each measured side by side, are steadier. Rerun on a quiet "
                f"machine for absolute figures.")
        else:
            out.append(f"- A quiet machine ({load}); a virtual machine on a shared host, "
                       f"so absolute rates still drift between runs: read the ratios.")
    out += ["", "## Results", "",
            "| scenario | what | target | met | figures |", "|---|---|---|---|---|"]
    for row in results:
        quick = " (quick)" if row.get("quick") else ""
        out.append(f"| {row['scenario']}{quick} | {WHAT.get(row['scenario'], '')} | "
                   f"{row['target']} | {'yes' if row['met'] else '**no**'} | "
                   f"{_figures(row)} |")
    missed = [row["scenario"] for row in results
              if not row["met"] and row["scenario"] in LIMITS]
    if missed:
        out += ["", "## Where a target is missed", ""]
        out += [f"- **{name}**: {LIMITS[name]}" for name in missed]
    chart = _timeline_chart()
    if chart:
        out += ["", "## Fairness timeline", "",
                "Task starts after tenant B enqueues 10 tasks behind tenant A's 2,000 "
                "(20 ms tasks, 4 worker slots): plain Celery runs B after all of A; "
                "celery-fair starts B's tasks at once, interleaved with A's.", "",
                f"![timeline]({chart.name})"]
    return out


def _timeline_chart() -> Path | None:
    source = harness.RESULTS / "timeline.json"
    if not source.exists():
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = timeline_figure(json.loads(source.read_text(encoding="utf-8")))
    path = DOCS / "fairness-timeline.png"
    DOCS.mkdir(exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def timeline_figure(data: dict[str, Any]) -> Any:
    """Plain Celery's and celery-fair's task starts, one panel each, on one time axis:
    with an x scale per panel, FIFO's 40 s and fair's 1 s looked alike."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(9, 4.5), sharex=True)
    for ax, mode, title in zip(axes, ("fifo", "fair"), ("plain Celery (FIFO)", "celery-fair")):
        rows = data.get(mode, [])
        for tenant, colour, y in (("A", "#9aa5b1", 0), ("B", "#d9480f", 1)):
            xs = [t for who, t in rows if who == tenant and t > -0.5]
            ax.scatter(xs, [y] * len(xs), s=6, c=colour, label=f"tenant {tenant}")
        ax.set_yticks([0, 1], ["A", "B"])
        ax.set_title(title, fontsize=10, loc="left")
        ax.axvline(0, color="black", linewidth=0.5)
    axes[-1].set_xlabel("seconds after B enqueued its 10 tasks (one scale for both)")
    fig.tight_layout()
    return fig
