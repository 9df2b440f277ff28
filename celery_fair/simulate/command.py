"""``celery -A proj fair simulate TRACE`` (the app's caps, weights and rates) and ``python
-m celery_fair.simulate TRACE`` (no settings): one click command for both."""

from __future__ import annotations

import json
from typing import Any

import click

from .engine import CHARGES, CHARGING, POLICIES, BadSimulation, simulate
from .report import figures, plot, render
from .trace import BadTrace, read_trace


def _names(allowed: tuple[str, ...]) -> Any:
    def callback(ctx: click.Context, param: click.Parameter, value: str) -> list[str]:
        names = [n.strip() for n in value.split(",") if n.strip()]
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise click.BadParameter(f"{', '.join(unknown) or 'nothing'}: expected a comma "
                                     f"separated list of {', '.join(allowed)}", ctx, param)
        return names
    return callback


def options(command: Any) -> Any:
    """The simulator's arguments and options, on either command."""
    for decorator in reversed([
        click.argument("trace", type=click.Path(dir_okay=False)),
        click.option("--slots", type=click.IntRange(1, 100_000), default=4, show_default=True,
                     help="Virtual worker slots (the workers' pool sizes summed)."),
        click.option("--policy", "policies", default="fifo,wfq", show_default=True,
                     callback=_names(POLICIES),
                     help="Policies to replay, comma separated (fifo: plain Celery; "
                          "wfq, harmony, smallest: fair_policy; smallest ages by the "
                          "app's fair_aging_seconds, default 1)."),
        click.option("--charge", "charges", default="cost", show_default=True,
                     callback=_names(CHARGES),
                     help="What a dispatch charges a group under wfq and smallest, comma "
                          "separated "
                          "(fair_charge): count (1 per task), cost (the declared cost, the "
                          "default) or runtime (the time the task ran)."),
        click.option("--plot", "plot_path", default=None, metavar="PNG",
                     help="Draw each group's waits over time, one panel per run."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON."),
    ]):
        command = decorator(command)
    return command


def run(trace: str, slots: int, policies: list[str], charges: list[str],
        plot_path: str | None, as_json: bool, settings: Any = None) -> None:
    try:
        tasks = read_trace(trace)
        runs = [simulate(tasks, slots, p, c, settings) for p in policies
                for c in (charges if p in CHARGING else charges[:1])]  # harmony: none
        if plot_path:
            plot(runs, plot_path)
    except (BadTrace, BadSimulation) as exc:
        raise click.ClickException(str(exc)) from None
    results = [figures(r) for r in runs]
    if as_json:
        click.echo(json.dumps([f.as_json() for f in results], indent=2))
        return
    from rich.console import Console

    Console(width=100).print(render(results))


@click.command(name="simulate")
@options
def main(trace: str, slots: int, policies: list[str], charges: list[str],
         plot_path: str | None, as_json: bool) -> None:
    """Replay a trace (CSV or JSON lines: at, group, cost, duration, interactive) through
    celery-fair's policy with a virtual clock and SLOTS workers, next to plain Celery's
    FIFO: per-group waits, shares of worker time, Jain index, utilization."""
    run(trace, slots, policies, charges, plot_path, as_json)
