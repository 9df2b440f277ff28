"""``python -m bench model`` (the model test as a long campaign): its input is checked
before any test runs. (The test it runs is tests/test_store_model.py, which CI runs with
its own, smaller defaults.)"""

from __future__ import annotations

import pytest

from bench.__main__ import main


@pytest.mark.parametrize("option", ["--examples", "--sql-examples"])
def test_a_count_of_examples_below_one_is_refused_naming_the_option(
        option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["model", option, "0"])
    assert exited.value.code == 2
    assert f"{option} must be a positive number of examples, got 0" in capsys.readouterr().err
