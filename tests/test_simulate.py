"""The policy simulator (``fair simulate``, ``python -m celery_fair.simulate``): traces
read or refused by line and column; a replay through the memory store's real policy
against plain Celery's FIFO (a newcomer behind a backlog starts at once under wfq, and
waits the whole backlog under FIFO); charges; the app's settings (a cap, a rate) under
``celery -A proj``; the plot; and the samples in docs/policies.md, which are what the
command prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from celery_fair.limits import Rate
from celery_fair.simulate import (
    BadSimulation,
    BadTrace,
    TraceTask,
    command,
    figures,
    read_trace,
    simulate,
)
from celery_fair.store.base import Policy

from .control_helpers import cli
from .samples import check_sample

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"


def trace(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def backlog_and_newcomer(tmp_path: Path) -> Path:
    rows = ["at,group,duration"] + ["0,big,1"] * 20 + ["0.5,small,1"]
    return trace(tmp_path, "\n".join(rows) + "\n")


def test_a_newcomer_waits_the_backlog_under_fifo_and_starts_next_under_wfq(
        tmp_path: Path) -> None:
    tasks = read_trace(backlog_and_newcomer(tmp_path))
    fifo, wfq = (figures(simulate(tasks, 2, p)) for p in ("fifo", "wfq"))
    small = {f.policy: next(g for g in f.groups if g.group == "small") for f in (fifo, wfq)}
    assert small["fifo"].wait_max == pytest.approx(9.5)  # 20 tasks of 1 s on 2 slots
    assert small["wfq"].wait_max == pytest.approx(0.5)  # the next free slot
    # the same work either way: 21 tasks of 1 s on 2 slots end at 11 s
    assert fifo.makespan == wfq.makespan == pytest.approx(11.0)
    assert fifo.utilization == wfq.utilization == pytest.approx(21 / 22)


def test_harmony_keeps_slots_for_the_group_with_fewer_in_flight() -> None:
    """Six 3 s tasks and forty 0.1 s ones on 4 slots: wfq alternates dispatches, so the
    long tasks pile up in the slots; Harmony keeps two each, and the short ones drain."""
    tasks = [TraceTask(0, "slow", 1, 3.0, False)] * 6 + \
        [TraceTask(0, "quick", 1, 0.1, False)] * 40
    waits = {p: {g.group: g.wait_max for g in figures(simulate(tasks, 4, p)).groups}
             for p in ("wfq", "harmony")}
    assert waits["wfq"]["quick"] == pytest.approx(4.9)  # behind 4 slow ones at 3 s
    assert waits["harmony"]["quick"] == pytest.approx(1.9)  # 40 on 2 slots: 20 x 0.1 s
    assert waits["harmony"]["slow"] == pytest.approx(3.0)  # 2 at once, then the rest


def test_smallest_runs_a_groups_small_tasks_before_its_big_one() -> None:
    """One slot: a task of cost 10 (1 s) published first, then twenty of cost 1 (0.1 s)
    in the same group. Under wfq (and smallest without aging) the big one goes first;
    under smallest with aging 1 s it ranks 10 s later, behind all twenty."""
    tasks = [TraceTask(0, "a", 10, 1.0, False)] + [TraceTask(0, "a", 1, 0.1, False)] * 20

    def starts(policy: str, aging: float = 1.0) -> list[float | None]:
        run = simulate(tasks, 1, policy, "cost",
                       Policy(None, 0, 1.0, {}, {}, aging_seconds=aging))
        return [start for _, _, start, _ in run.tasks]

    assert starts("wfq")[0] == 0.0 and starts("smallest", aging=0)[0] == 0.0
    smallest = starts("smallest")
    assert smallest[0] == pytest.approx(2.0)  # after the twenty small ones
    assert max(smallest[1:]) == pytest.approx(1.9)


def test_subgroups_of_a_group_take_turns_under_fair_subgroup_path() -> None:
    """One slot: alice's ten tasks of 0.1 s at 0, bob's two (the same group, the trace's
    ``subgroup`` column) at 0.05 s. With fair_subgroup 'path' bob's alternate with
    alice's (0.2 s and 0.3 s: bob's first key ties alice's next, by hold id); without
    it, after alice's ten; under 'smallest' (which orders the group itself) the
    subgroups are not used."""
    tasks = [TraceTask(0, "acme", 1, 0.1, False, "alice")] * 10 + \
        [TraceTask(0.05, "acme", 1, 0.1, False, "bob")] * 2

    def bob(policy: str, subgroup: str) -> list[float | None]:
        run = simulate(tasks, 1, policy, "cost",
                       Policy(None, 0, 1.0, {}, {}, subgroup=subgroup))
        return [start for _, _, start, _ in run.tasks[10:]]

    assert bob("wfq", "path") == pytest.approx([0.2, 0.3])
    assert bob("harmony", "path") == pytest.approx([0.2, 0.3])
    assert bob("wfq", "none") == pytest.approx([1.0, 1.1])
    assert bob("smallest", "path") == pytest.approx([1.0, 1.1])


def test_charging_the_declared_cost_evens_worker_time() -> None:
    tasks = read_trace(EXAMPLES / "mixed-durations.csv")
    by_charge = {c: figures(simulate(tasks, 4, "wfq", c)) for c in ("count", "cost")}
    shares = {c: {g.group: g.worker_share for g in f.groups} for c, f in by_charge.items()}
    assert shares["count"]["exports"] > 0.85  # ten times the reports' worker time
    assert shares["cost"]["exports"] == pytest.approx(0.5, abs=0.02)
    assert by_charge["cost"].jain > 0.99


def test_charging_the_runtime_evens_worker_time_without_costs() -> None:
    """10 ms and 100 ms tasks, the same declared cost: counted (as charged by cost), the
    long ones take ten times the worker time; charged by the runtime each release reports,
    the shares are even."""
    tasks = [TraceTask(0, "slow", 1, 0.1, False)] * 300 + \
        [TraceTask(0, "quick", 1, 0.01, False)] * 3000
    shares = {c: {g.group: g.worker_share for g in figures(simulate(tasks, 4, "wfq", c)).groups}
              for c in ("cost", "runtime")}
    assert shares["cost"]["slow"] > 0.85
    assert shares["runtime"]["slow"] == pytest.approx(0.5, abs=0.02)


def test_settings_apply_a_cap_and_a_rate(tmp_path: Path) -> None:
    rows = ["at,group,duration"] + ["0,a,1"] * 4 + ["0,b,0.01"] * 4
    tasks = read_trace(trace(tmp_path, "\n".join(rows) + "\n"))
    run = simulate(tasks, 4, "wfq", settings=Policy(None, 0, 1.0, {"a": 1}, {},
                                                     rates={"b": Rate(1000.0)}))
    starts = {g: sorted(s for grp, _, s, _ in run.tasks if grp == g and s is not None)
              for g in ("a", "b")}
    assert starts["a"] == [0.0, 1.0, 2.0, 3.0]  # a cap of 1: one at a time
    assert starts["b"] == pytest.approx([0.0, 0.98, 1.98, 2.98])  # 1/s, tokens ~20 ms early
    never = simulate(tasks, 4, "wfq", settings=Policy(None, 0, 1.0, {"a": 0}, {}))
    assert [g.started for g in figures(never).groups] == [0, 4]  # a cap of 0: never


@pytest.mark.parametrize("text, name, match", [
    ("", "t.csv", r"header lacks at, duration, group \(it has nothing\)"),
    ("at,group,duration\n", "t.csv", r"no tasks"),
    ("at,group\n0,a\n", "t.csv", r"header lacks duration"),
    ("at,group,duration\n0,a,1\n-1,a,1\n", "t.csv", r"line 3: column 'at' must be .* got '-1'"),
    ("at,group,duration\n0,,1\n", "t.csv", r"line 2: column 'group' is missing"),
    ("at,group,duration,cost\n0,a,1,0\n", "t.csv", r"column 'cost' must be .* > 0"),
    ("at,group,duration,interactive\n0,a,1,maybe\n", "t.csv", r"true or false"),
    ('{"at": 0, "group": "a", "duration": 1}\n[1]\n', "t.jsonl", r"line 2: expected a JSON"),
    ('{"at": 0, "group": "a", "duration": "x"}\n', "t.jsonl", r"'duration' must be"),
    ("at,group,duration\n0,a b\x00,1\n", "t.csv", r"line 2: "),
])
def test_bad_traces_are_refused_naming_line_and_column(tmp_path: Path, text: str,
                                                       name: str, match: str) -> None:
    with pytest.raises(BadTrace, match=match):
        read_trace(trace(tmp_path, text, name))


def test_bad_runs_are_refused(tmp_path: Path) -> None:
    tasks = read_trace(backlog_and_newcomer(tmp_path))
    with pytest.raises(BadSimulation, match="policy 'lottery' is not one"):
        simulate(tasks, 2, "lottery")
    with pytest.raises(BadSimulation, match="charge 'seconds' is not one"):
        simulate(tasks, 2, "wfq", "seconds")
    with pytest.raises(BadSimulation, match="slots must be an integer >= 1"):
        simulate(tasks, 0)
    with pytest.raises(BadTrace, match="cannot be read"):
        read_trace(tmp_path / "missing.csv")


def test_the_celery_command_uses_the_apps_settings_and_plots(app, tmp_path: Path) -> None:
    app.conf.fair_group_concurrency = {"big": 1}
    from celery_fair.config import reset_config

    reset_config(app)
    png = tmp_path / "waits.png"
    result = cli(app, "simulate", str(backlog_and_newcomer(tmp_path)), "--slots", "2",
                 "--json", "--plot", str(png))
    runs = {r["policy"]: r for r in json.loads(result.output)}
    big = next(g for g in runs["wfq"]["groups"] if g["group"] == "big")
    assert big["wait_max"] == pytest.approx(19.0)  # one at a time under its cap of 1
    assert png.read_bytes().startswith(b"\x89PNG")
    bad = CliRunner().invoke(command.main, [str(tmp_path / "nope.csv"), "--policy", "wfq,nope"])
    assert bad.exit_code == 2 and "nope: expected a comma separated list" in bad.output


@pytest.mark.parametrize("name, args", [
    ("simulate-noisy-neighbour", ["docs/examples/noisy-neighbour.csv"]),
    ("simulate-mixed-durations", ["docs/examples/mixed-durations.csv", "--policy", "wfq",
                                  "--charge", "count,cost"]),
    ("simulate-policies", ["docs/examples/mixed-durations.csv", "--policy", "wfq,harmony",
                           "--charge", "count"]),
])
def test_the_policies_page_samples_are_what_the_command_prints(name: str,
                                                               args: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "celery_fair.simulate", *args], cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    check_sample(name, f"$ python -m celery_fair.simulate {' '.join(args)}\n{out}")
