"""The SQL store's benchmarks run (``python -m bench ... --store S --smoke``): each scenario
of the issue's four measures celery-fair on the store against plain Celery on the same
RabbitMQ, reports the figures the docs table shows, and leaves no database or virtual
host behind. Tiny workloads: whether targets are met is the full run's business."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

import bench.harness
from bench.__main__ import SQL_SCENARIOS, main
from bench.sqlstores import POSTGRESQL

from . import components

#: Figures each scenario reports, on top of its rates (so the report can show them).
EXPECTED = {
    "hold": {"plain_per_s", "fair_per_s", "ratio", "fair_cpu_ms_per_task"},
    "dispatch": {"fair_dispatches_per_s", "kombu_publish_per_s", "dispatch_cpu_ms_per_task"},
    "end_to_end": {"plain_per_s", "fair_per_s", "ratio", "fair_cpu_ms_per_task"},
    "pick_groups": {"picks_per_s_10", "picks_per_s_1000", "ratio_largest_vs_10"},
}


def _databases() -> set[str]:
    engine = create_engine(POSTGRESQL + "/postgres")
    try:
        with engine.connect() as conn:
            return {row[0] for row in conn.execute(text(
                "SELECT datname FROM pg_database WHERE datname LIKE 'celery_fair_bench_%'"))}
    finally:
        engine.dispose()


def _vhosts() -> set[str]:
    ctl = shutil.which("rabbitmqctl")
    assert ctl, "rabbitmqctl is needed (the running RabbitMQ on 127.0.0.1:5672)"
    out = subprocess.run([ctl, "list_vhosts", "-q"], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return {line.strip() for line in out.splitlines() if line.startswith("fair-bench-")}


def test_sql_benchmarks_run_report_and_clean_up(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # PostgreSQL only: the targets are its; MariaDB and SQLite run the same code
    # (`python -m bench ... --store sqlite --smoke` for a look).
    store = "postgresql"
    components.require(components.POSTGRESQL)
    components.require(components.RABBITMQ)
    monkeypatch.setattr(bench.harness, "RESULTS", tmp_path)
    databases, vhosts = _databases(), _vhosts()

    assert main([*SQL_SCENARIOS, "--store", store, "--smoke", "--reps", "1"]) == 0

    rows = [json.loads(line) for line in
            (tmp_path / f"latest-{store}.jsonl").read_text().splitlines()]
    assert [row["scenario"] for row in rows] == list(SQL_SCENARIOS)
    for row in rows:
        assert row["store"] == store
        assert EXPECTED[row["scenario"]] <= set(row), row
        rates = [v["median"] for k, v in row.items() if "_per_s" in k]
        assert rates and all(rate > 0 for rate in rates), row
    assert rows[0]["fair_db_cpu_ms_per_task"]["median"] > 0  # read from its backends
    assert not _databases() - databases  # this run's database was dropped
    assert not _vhosts() - vhosts  # and its virtual host deleted


def test_held_is_refused_on_a_sql_store(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["held", "--store", "sqlite"])
    assert "held with --store sqlite" in capsys.readouterr().err
