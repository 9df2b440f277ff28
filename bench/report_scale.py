"""The "Scaling over Redis Cluster" section of docs/benchmarks.md, from the last row of
bench/results/scale.jsonl (``python -m bench scale``)."""

from __future__ import annotations

import json
import time
from typing import Any

from . import harness

TITLE = "## Scaling over Redis Cluster"

INTRO = (
    "`python -m bench scale [--quick]` (issue 15): the fair store on one redis-server "
    "against a Redis Cluster of 3 primaries with a replica each, in the same run, every "
    "part a process of its own. Held no-op tasks over 10 groups per fair queue; "
    "dispatchers (`celery fair dispatch --shard i/n`) publish through kombu to a broker "
    "redis-server of their own on both sides (`fair_direct_push` off: a cluster has no "
    "direct push), so the sides differ only in the store; one node with direct push (the "
    "broker is then the store's Redis) is given for reference. Rates are counted from 10 % "
    "to 90 % of the tasks (the processes' start-up is outside), and the CPU of each "
    "process (/proc/<pid>/stat) over the same window, in µs per task; *store* sums every "
    "node of the store (the cluster's replicas too; its primaries' share in brackets). "
    "Queue i is on dispatcher shard i mod n and cluster primary i mod 3: each dispatcher "
    "talks to one primary, the best case of `--shard`.")

#: What limits the cluster's figures on this machine (from the run of 2026-11-26, full
#: size, load average 4.6 on 2 cores; the CPU per task held across the quick and full runs).
LIMITS = (
    "**What limits it here: not Redis.** On one node the store's Redis spends ~22 µs of "
    "CPU per dispatch and the broker ~4 µs, against ~75-90 µs in the dispatcher (kombu's "
    "publish of each message and the pick's reply): at ~8,700 dispatches/s the store's "
    "redis-server used about a fifth of a core. The cluster spreads Redis work that was "
    "not the bottleneck, and costs more of it (~37 µs per dispatch on the primaries, "
    "~50 µs with the replicas' copies), while the dispatchers, the real limit, cost the "
    "same per dispatch on both (81-89 µs against 73-89 µs). More dispatchers do not help "
    "either: 2 or 3 of them, 9 redis-servers and the other jobs of the machine (load 4.6 "
    "before the run) share 2 cores, so the rates swing by 2× between measures of the "
    "same kind (the cluster's 3,082/s with 1 dispatcher against 7,482/s with 2). The 2× "
    "target needs a store-bound workload and a core per process. From the CPU per task "
    "measured in the drain (store 336 µs per task on one node, 435 µs over the "
    "cluster's 3 primaries, hold excluded), one Redis core tops out near 3,000 tasks/s "
    "and 3 primaries near 3 × 3,000 × 336 / 435 ≈ 6,900 tasks/s: ≈ 2.3× on a machine "
    "where each primary has a core and the dispatchers and workers have cores of their "
    "own (docs/capacity.md).")


def _latest() -> dict[str, Any] | None:
    path = harness.RESULTS / "scale.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    return rows[-1] if rows else None


def _cpu(figures: dict[str, Any], part: str) -> str:
    value = figures["us_cpu"].get(part)
    text = "—" if value is None else f"{value:,}"
    primaries = figures["us_cpu"].get("primaries") if part == "store" else None
    return text if primaries is None else f"{text} ({primaries:,} primaries)"


def _store(name: str) -> str:
    return {"single": "one node", "cluster": "cluster (3 primaries)",
            "single_direct": "one node, direct push"}[name.split("/")[0]]


def scale_lines() -> list[str]:
    """The section, or [] without results."""
    row = _latest()
    if row is None:
        return []
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(row["at"]))
    queues = next(iter(row["dispatch"].values()))["queues"]
    out = [TITLE, "", INTRO, "",
           f"Run {when}, commit `{row['commit']}`, size {row['size']}, load average "
           f"{row['load_before']:.1f} before, {row['machine']['cpus']} CPUs.", "",
           f"**Dispatch** ({queues} fair queues, no worker): aggregate dispatches/s; "
           f"cluster/single (best of each): **{row['dispatch_ratio']}** (target ≥ 2).", "",
           "| store | dispatchers | tasks | dispatches/s | µs CPU/dispatch: store | broker "
           "| dispatchers |", "|---|---|---|---|---|---|---|"]
    for key, fig in row["dispatch"].items():
        out.append(f"| {_store(key)} | {fig['dispatchers']} | {fig['tasks']:,} | "
                   f"{fig['per_s']:,.0f} | {_cpu(fig, 'store')} | {_cpu(fig, 'broker')} | "
                   f"{_cpu(fig, 'dispatcher')} |")
    out += ["", f"**Drain** (2 workers, threads, 8 each): tasks/s; cluster/single "
            f"**{row['drain_ratio']}**.", "",
            "| store | dispatchers | tasks | tasks/s | µs CPU/task: store | broker | "
            "dispatchers | workers |", "|---|---|---|---|---|---|---|---|"]
    for key, fig in row["drain"].items():
        out.append(f"| {_store(key)} | {fig['dispatchers']} | {fig['tasks']:,} | "
                   f"{fig['per_s']:,.0f} | {_cpu(fig, 'store')} | {_cpu(fig, 'broker')} | "
                   f"{_cpu(fig, 'dispatcher')} | {_cpu(fig, 'worker')} |")
    out += ["", "**How the cost grows** (dispatch, no worker):", "",
            "| queues | store | dispatchers | dispatches/s | µs CPU/dispatch: store | "
            "dispatchers |", "|---|---|---|---|---|---|"]
    for fig in row["growth"]:
        store = fig.get("store") or ("single" if fig["dispatchers"] == 1 else "cluster")
        out.append(f"| {fig['queues']} | {_store(store)} | {fig['dispatchers']} | "
                   f"{fig['per_s']:,.0f} | {_cpu(fig, 'store')} | "
                   f"{_cpu(fig, 'dispatcher')} |")
    return out + ["", LIMITS]
