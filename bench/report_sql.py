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
    "At the measured commits no target was met on any of the three databases "
    "(PostgreSQL was measured again after the store's pick optimizations merged: "
    "`861af66`). Profiled on PostgreSQL with `python -m bench.profile hold|dispatch|pick "
    "--store postgresql` (cProfile). The store was measured as it is, not tuned.", "",
    "- **hold** (profiled at `77172a2`; the hold is the same at `861af66`): a fair "
    "`delay()` is BEGIN, three statements (lock the group row, `unit.lock_groups`; "
    "insert the message; update the group and ready rows, `unit._flush_groups`) and "
    "COMMIT: five round trips to the database (5,006 psycopg waits for 1,000 holds), "
    "where plain `delay()` is one AMQP publish without a confirm. 1,000 holds: 2.7 s, "
    "of which `engine.transaction` 2.0 s (`lock_groups` 0.6, COMMIT 0.7, the insert "
    "0.34) and psycopg waiting on the server 1.5 s; the client's own work is small. "
    "Fewer round trips per hold (one statement, or psycopg's pipeline mode for the "
    "three) is what would move the ratio.",
    "- **dispatch** (`861af66`): 3,000 dispatches in 3.65 s, of which publishing 2.8 s "
    "(77 %; 2.3 s in `amqp` `basic_publish_confirm`: the dispatcher waits for "
    "RabbitMQ's confirm of each message before the next) and the store's pick 0.7 s "
    "(19 %). The broker's confirms, one at a time, now bound the dispatcher, not the "
    "store: publishing a batch and then waiting for its confirms together "
    "(`publisher.py`) is the next step to 3,000/s. Plain kombu publish without confirms "
    "does 8-23x the fair rate on the same broker.",
    "- **pick_groups** (`861af66`; the heads of the groups reached read in one LATERAL "
    "query on PostgreSQL): the query's plan goes wrong on a table filled since its last "
    "ANALYZE (a new database here; any burst in production). With 20,000 messages in "
    "10,000 groups and no statistics yet (`pg_stat_user_tables`: never analyzed), "
    "`EXPLAIN ANALYZE` of the heads query for 500 groups reads each group through the "
    "index `fair_messages_due` (ns, queue), filtering 19,998 rows per group: 2.4 s per "
    "pick; after `ANALYZE fair_messages` it uses `fair_messages_list`: 2.6 ms. So a "
    "pick costs O(groups reached x messages in the queue) until autovacuum analyzes the "
    "table: ~3.7 ms of the database's CPU per picked message with 10,000 groups "
    "(0.08 ms with 10). Making `fair_messages_due` partial (`WHERE due_ms IS NOT NULL`: "
    "only delayed messages have a due time) left the planner `fair_messages_list` "
    "without statistics for the single-group read (0.06 ms against 12 ms; checked by "
    "hand, and CREATE INDEX also refreshed the table's row count). Besides, "
    "`_Picking._head` scans every head read for each message taken (500 x 500 key "
    "calls per pick of 500 over 2,000 groups: 0.5 s of 2.9 s at `77172a2`).",
    "- **end_to_end**: on MariaDB and SQLite a dispatcher in another process learns of "
    "a release only by looking again every 0.1 s (`wakes.POLL_SECONDS`: they have no "
    "NOTIFY), taking at most the queue's capacity then (8 worker slots + 2 ahead): at "
    "most ~100 tasks/s, whatever the store's speed. On PostgreSQL (NOTIFY) a sampling "
    "profile (py-spy, 2,000 tasks) puts the worker's time in `release` (35 %) and "
    "`begin` (17 %) transactions and the dispatcher's in its store calls (73 %: pick, "
    "promote, confirm, each its own transaction per step of a few messages) and "
    "RabbitMQ confirms; the CPU per task columns give the totals.",
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
