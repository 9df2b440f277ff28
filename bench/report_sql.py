"""The SQL stores' section of docs/benchmarks.md, from bench/results/latest-<store>.jsonl.

One table, a column per database, so the three read side by side; each store's run is
described on its own line (they run one after the other: ``--store`` takes one)."""

from __future__ import annotations

import json
import time
from typing import Any

from .harness import results_file

SQL = ("postgresql", "mariadb", "sqlite")

#: What each scenario measures on a SQL store.
WHAT = {
    "hold": "`delay()` of a fair task vs plain `delay()` (no workers), tasks/s",
    "dispatch": "the dispatcher alone moving 10,000 held tasks (100 groups) into "
                "RabbitMQ, dispatches/s; plain kombu publish of the same messages for scale",
    "end_to_end": "no-op tasks drained by the same worker (threads, 8), fair vs plain, "
                  "tasks/s",
    "pick_groups": "the store's `pick` (500 at a time) called in a loop with 10 and "
                   "10,000 backlogged groups, messages/s",
}

INTRO = [
    "## SQL stores", "",
    "The SQL store (`fair_store_url` a PostgreSQL, MariaDB or SQLite URL) measured "
    "against plain Celery in the same run. A shop on a SQL store runs no Redis, so the "
    "broker of both sides is RabbitMQ (a virtual host of the run's own on the server at "
    "127.0.0.1:5672), with no result backend; the run's redis-server only keeps the "
    "benchmark's own counters (the task body's, on both sides alike). Each run creates "
    "its database (`celery_fair_bench_<hex>`, tables by "
    "`celery_fair.store.sql.migrate`) and drops it at the end. Commands:", "",
    "```",
    "python -m bench all --store postgresql --e2e-tasks 4000",
    "python -m bench all --store mariadb --e2e-tasks 4000",
    "python -m bench all --store sqlite --e2e-tasks 4000",
    "python -m bench report",
    "```", "",
    "`all` on a SQL store is `hold dispatch end_to_end pick_groups`. CPU per task is in ms: "
    "`*_cpu_ms_per_task` is the benchmark process's (with the forked dispatcher in "
    "end_to_end; SQLite runs inside it), `*_db_cpu_ms_per_task` the database server's: "
    "PostgreSQL's backends of the run's database; MariaDB's whole `mysqld` "
    "(performance_schema is off, so other jobs on the shared server count too). "
    "RabbitMQ's CPU is not counted (the same broker on both sides). `pick_groups` times "
    "the store's `pick` alone, not the dispatcher: picking is what the number of groups "
    "could slow down, and publishing is the dispatch scenario's. The machine has 2 CPUs "
    "and was shared with other jobs (see each run's load): read the ratios.",
]


def _rows(store: str) -> dict[str, dict[str, Any]]:
    path = results_file(store)
    if not path.exists():
        return {}
    rows: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows[row["scenario"]] = row
    return rows


def _run_line(store: str) -> str:
    path = results_file(store, "run", ".json")
    if not path.exists():
        return f"- {store}: scenarios run one by one (no `all` run recorded)."
    run = json.loads(path.read_text(encoding="utf-8"))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(run["started"]))
    info = run["machine"]
    return (f"- {store}: commit `{run['commit']}`, {when}, {run['seconds'] // 60} min "
            f"{run['seconds'] % 60} s; {info['cpus']} CPUs ({info['cpu']}), load average "
            f"{run['load_before'][0]:.1f} before, {run['load_after'][0]:.1f} after.")


#: What limits the SQL store where it misses a target (profiled: see the issue's notes).
LIMITS: list[str] = [
    "Profiled on PostgreSQL with `python -m bench.profile hold|dispatch --store "
    "postgresql` (cProfile; the machine loaded by other jobs, so read the shares, not "
    "the seconds). The store was measured as it is, not tuned.", "",
    "- **hold**: a fair `delay()` is one transaction of three statements (lock the group "
    "row, `unit.lock_groups`; insert the message, `insert_ignore`; update the group and "
    "ready rows, `unit._flush_groups`) plus BEGIN and COMMIT, where plain `delay()` is "
    "one AMQP publish. 1,000 holds: 15.2 s, of which `engine.transaction` 13.4 s "
    "(`lock_groups` 5.8, `_flush_groups` 2.8, `_insert_message` 2.3, BEGIN/COMMIT the "
    "rest) and psycopg waiting on the server 9.5 s; SQLAlchemy's statement compiling and "
    "cache keys ~1 s. So round trips to the database, not CPU, set the rate: the client "
    "CPU per hold is ~1.5 ms against plain's ~0.3 ms, the server's ~0.4 ms.",
    "- **dispatch**: on RabbitMQ the dispatcher publishes with a publisher confirm per "
    "message, waited for one at a time (`amqp` `basic_publish_confirm`). 3,000 "
    "dispatches: 24.3 s, of which publishing 15.6 s (14.0 s in `basic_publish_confirm`, "
    "9.5 s of it reading the confirm), the store's pick 7.8 s (`_Picking._pop`, a SELECT "
    "per group, 4.2 s) and confirm the rest. The broker's confirms bound it before the "
    "store does; plain kombu publish without confirms does several times the rate.",
    "- **pick_groups**: `python -m bench.profile pick --groups 2000 -n 1000`: two picks "
    "of 500 took 3.7 s, of which `_Picking._pop` 2.3 s (a SELECT of its own per group "
    "read: with many groups, one per message) and `_Picking._head` 0.74 s (each message "
    "taken scans every head read: 500 x 500 key calls per pick). And that SELECT's plan "
    "goes wrong: psycopg prepares a statement after 5 runs, and PostgreSQL's generic plan "
    "for it (`SET plan_cache_mode = force_generic_plan`, then `EXPLAIN ANALYZE EXECUTE`) "
    "uses the index `fair_messages_due` (ns, queue) and filters every message of the "
    "queue (1,192 rows removed to read one group of 50), where the custom plan uses "
    "`fair_messages_list`. Each group's read then costs O(messages in the queue): ~7 ms "
    "of the database's CPU per message with 10,000 groups.",
    "- **end_to_end**: a fair task adds the hold, a pick and confirm in the dispatcher, "
    "and `begin` and `release` transactions in the worker: the CPU per task columns "
    "show where.",
]


def sql_section() -> list[str] | None:
    """The section's lines, or None when no SQL store has results."""
    from .report import _figures

    results = {store: _rows(store) for store in SQL}
    stores = [store for store in SQL if results[store]]
    if not stores:
        return None
    out = [*INTRO, "", "### The runs", ""]
    out += [_run_line(store) for store in stores]
    out += ["", "### Results", "",
            "| scenario | what | target | " + " | ".join(stores) + " |",
            "|---|---|---|" + "---|" * len(stores)]
    scenarios = [name for name in WHAT if any(name in results[s] for s in stores)]
    for name in scenarios:
        target = next(results[s][name]["target"] for s in stores if name in results[s])
        cells = []
        for store in stores:
            row = results[store].get(name)
            cells.append("not run" if row is None else
                         f"{'met' if row['met'] else '**not met**'}"
                         f"{' (quick)' if row.get('quick') else ''}<br>{_figures(row)}")
        out.append(f"| {name} | {WHAT[name]} | {target} | " + " | ".join(cells) + " |")
    if LIMITS:
        out += ["", "### Where the time goes", "", *LIMITS]
    return out
