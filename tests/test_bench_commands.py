"""The Redis commands a task's path costs (``python -m bench commands``, small here): the
scripts' figures may not creep back up. Bounds: the figures DESIGN.md's "Commands per
task" gives, each rounded up, on the scenarios it measured (issue 17)."""

from __future__ import annotations

import pytest

from bench import commands

#: commands per task, per scenario and script: at most (before the leaner scripts:
#: backlog 38 / 14.3 / 3 / 4 / 28.8, own 40 / 17.1 / 3 / 4 / 23, capped 38 / 29.5 / 3 / 4 /
#: 30.4). A hold reads the refill parameters (one HMGET) since refill in release.
BOUNDS = {
    "backlog": {"hold": 24.1, "pick": 8.8, "confirm": 3, "begin": 4, "release": 12.5},
    "own": {"hold": 27, "pick": 15.2, "confirm": 3, "begin": 4, "release": 17.1},
    "capped": {"hold": 24.1, "pick": 22.1, "confirm": 3, "begin": 4, "release": 18.1},
}


@pytest.mark.parametrize("scenario", list(BOUNDS))
def test_each_script_of_a_tasks_path_runs_no_more_commands_than_measured(
        scenario: str) -> None:
    figures = commands.run(scenario, 1000, 100)
    got = {name: row["commands_per_task"] for name, row in figures.items()}
    assert all(got[name] <= bound for name, bound in BOUNDS[scenario].items()), got
