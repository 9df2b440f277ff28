"""How ``celery fair status`` and ``celery fair groups`` look: rich views, the ``--json``
and ``--watch`` options (``fair workers`` has them too) and the watch loop.

The commands (cli.py) read the store; this module only turns what they read into text.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, TypeVar

import click
from celery.bin.base import CeleryOption

from .summary import format_wait

F = TypeVar("F", bound=Callable[..., Any])


def view_options(help_group: str) -> Callable[[F], F]:
    """``--json`` and ``--watch [SECONDS]`` of a command that :func:`show` prints."""
    def apply(command: F) -> F:
        command = click.option(
            "--watch", type=click.FloatRange(min=0.1), is_flag=False, flag_value=2.0,
            default=None, metavar="[SECONDS]",
            help="Refresh every SECONDS (default 2) until Ctrl-C.",
            cls=CeleryOption, help_group=help_group)(command)
        return click.option("--json", "as_json", is_flag=True,
                            help="Print JSON instead of a table.", cls=CeleryOption,
                            help_group=help_group)(command)
    return apply


def show(ctx: click.Context, read: Callable[[], list[dict[str, Any]]], as_json: bool,
          watch: float | None, render: Callable[[list[dict[str, Any]]], Any]) -> None:
    """Print once, or every ``watch`` seconds until Ctrl-C (a live view on a terminal,
    one JSON document per line with --json)."""
    from rich.console import Console
    from rich.live import Live

    console = Console(no_color=bool(getattr(ctx.obj, "no_color", False)),
                      highlight=False, soft_wrap=as_json)
    if not console.is_terminal:  # piped: no wrapping at 80 columns
        console.width = 240

    def view() -> Any:
        data = read()
        if as_json:
            return json.dumps({"queues": data}, indent=None if watch else 2)
        return render(data)

    if watch is None:
        console.print(view())
        return
    try:
        if console.is_terminal and not as_json:  # redraw in place
            with Live(view(), console=console, auto_refresh=False) as live:
                while True:
                    time.sleep(watch)
                    live.update(view(), refresh=True)
        else:  # piped: one view after another
            while True:
                console.print(view())
                time.sleep(watch)
    except KeyboardInterrupt:
        pass


def render_status(queues: list[dict[str, Any]]) -> Any:
    """The ``status`` view: a table of the queues' totals, then each queue's busiest
    groups. Each part is its own function, so a new part (a warning) slots in."""
    from rich.console import Group
    from rich.text import Text

    if not queues:
        return Text("no fair queues yet (nothing has been held)")
    parts: list[Any] = [queue_table(queues)]
    for q in queues:
        parts.extend(pause_line(q) + affinity_line(q) + liveness_lines(q))
    for q in queues:
        parts.extend(queue_groups(q))
    return Group(*parts)


#: The status table's columns: heading, and how a queue's figures give the cell.
QUEUE_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("queue", lambda q: str(q["queue"])),
    ("held", lambda q: str(q["held_interactive"] + q["held_background"])),
    ("interactive", lambda q: str(q["held_interactive"])),
    ("delayed", lambda q: str(q["delayed"])),
    ("in flight", lambda q: str(q["inflight"])),
    ("capacity", lambda q: str(q["capacity"])),
    ("ahead", lambda q: str(q["dispatch_ahead"])),
    ("oldest wait", lambda q: format_wait(q["oldest_wait"])),
    ("head wait", lambda q: format_wait(q.get("head_wait"))),
    ("groups", lambda q: str(q["group_count"])),
    ("released", lambda q: str(q["released"])),
    # the policy with its companions where not the default: 'wfq, soft-cap, i≤0.8'
    ("policy", lambda q: policy_cell(q)),
)


def policy_cell(q: dict[str, Any]) -> str:
    """The policy with its companions where not the default (``PolicyChoice.describe``:
    a charge other than 'cost' under wfq, soft caps, an interactive share)."""
    from .limits import DEFAULT_AGING
    from .policies import PolicyChoice

    return PolicyChoice(name=q["policy"], charge=q.get("charge") or "cost",
                        cap_mode=q.get("cap_mode") or "hard",
                        interactive_share=q.get("interactive_share"),
                        aging_seconds=q.get("aging_seconds", DEFAULT_AGING),
                        affinity=q.get("affinity") or "none",
                        spill_seconds=q.get("spill_seconds"),
                        group_queues=tuple((q.get("group_queues") or {}).items()),
                        subgroup=q.get("subgroup") or "none",
                        scope=q.get("scope") or "queue").describe()


def queue_table(queues: list[dict[str, Any]]) -> Any:
    """One row per fair queue. Capacity and dispatch-ahead are apart (summary.Capacity):
    6 in flight with capacity 4 and ahead 2 is within the limit, not a broken cap."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name, _ in QUEUE_COLUMNS:
        table.add_column(name, justify="left" if name == "queue" else "right")
    for q in queues:
        table.add_row(*(cell(q) for _, cell in QUEUE_COLUMNS))
    return table


def queue_groups(q: dict[str, Any]) -> list[Any]:
    """A queue's busiest groups, under a line naming the queue (none: nothing)."""
    from rich.text import Text

    if not q["groups"]:
        return []
    parts: list[Any] = [Text(f"\nqueue {q['queue']}: busiest groups"),
                        _group_table(q["groups"])]
    if q["more_groups"]:
        parts.append(Text(f"... and {q['more_groups']} more groups "
                          f"(celery fair groups --queue {q['queue']})"))
    return parts


def pause_line(q: dict[str, Any]) -> list[Any]:
    """A line when the whole queue is paused (``fair pause -Q``)."""
    from rich.text import Text

    from .audit import utc_text

    if "paused" not in q:
        return []
    until = q["paused"]["until_ms"]
    return [Text(f"queue {q['queue']}: PAUSED until "
                 f"{'fair resume' if until is None else utc_text(until)}: nothing is "
                 "dispatched", style="bold yellow")]


def affinity_line(q: dict[str, Any]) -> list[Any]:
    """A routed queue's (fair_affinity) moves so far and its workers' routed in flight."""
    from rich.text import Text

    if "affinity_moves" not in q:
        return []
    flights = ", ".join(f"{w} {n}" for w, n in sorted(q["worker_inflight"].items()))
    return [Text(f"queue {q['queue']}: affinity: {q['affinity_moves']} group moves between "
                 f"workers so far; in flight by worker: {flights or 'none'}")]


def liveness_lines(q: dict[str, Any]) -> list[Any]:
    """The queue's live dispatchers, one line each; or, with held work and none, a red
    warning naming the command that starts one (``liveness.py``)."""
    from rich.text import Text

    from .liveness import ago
    from .store.base import now_ms

    if q.get("warning"):
        return [Text(f"WARNING: {q['warning']}", style="bold red")]
    now = now_ms()
    return [Text(f"queue {q['queue']}: dispatcher {d['host']} pid {d['pid']}, last step "
                 f"{ago(now - d['last_step_ms']) + ' ago' if d['last_step_ms'] else 'none yet'}",
                 style="dim") for d in q.get("dispatchers", ())]


def render_groups(queues: list[dict[str, Any]]) -> Any:
    """The ``groups`` view: one table per queue."""
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = []
    for q in queues:
        parts.append(Text(f"queue {q['queue']}: {q['group_count']} groups with work"
                          + (" (PAUSED)" if "paused" in q else "")))
        if q["groups"]:
            parts.append(_group_table(q["groups"]))
    return Group(*parts) if parts else Text("no fair queues yet (nothing has been held)")


def boost_text(g: dict[str, Any]) -> str:
    """A boosted group's weight cell suffix: `` boost 10 until <UTC>`` (else empty)."""
    from .audit import utc_text

    boost = g.get("boosted")
    if not boost:
        return ""
    until = "" if boost["until_ms"] is None else f" until {utc_text(boost['until_ms'])}"
    return f" boost {boost['weight']:g}{until}"


def _group_table(rows: list[dict[str, Any]]) -> Any:
    from rich import box
    from rich.table import Table

    limited = any(g["limited"] for g in rows)
    notes = (["* runtime limit (celery fair limit)"] if limited else []) + \
        (["(paused) celery fair pause: resume with celery fair resume GROUP"]
         if any(g.get("paused") for g in rows) else []) + \
        (["boost: celery fair boost, in force instead of the weight until its end"]
         if any(g.get("boosted") for g in rows) else []) + \
        (["rate: celery fair limit --rate; (throttled) waits for its next token, or "
          "for the end of a task's fair_throttle"]
         if any(g.get("rate") or g.get("throttled_until_ms") for g in rows) else [])
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  caption="\n".join(notes) or None, caption_justify="left")
    waits = any("oldest_wait" in g for g in rows)  # status reads them; groups does not
    names = ("group", "held", "interactive", "delayed", "in flight", "cap", "weight")
    for name in names + (("oldest wait", "head wait") if waits else ()):
        table.add_column(name, justify="left" if name == "group" else "right")
    for g in rows:
        cap_mark = " *" if "cap" in g["limited"] else ""
        weight_mark = " *" if "weight" in g["limited"] else ""
        wait = (format_wait(g["oldest_wait"]), format_wait(g.get("head_wait"))) \
            if waits else ()
        table.add_row(g["group"] + (" (paused)" if g.get("paused") else "")
                      + (" (throttled)" if g.get("throttled_until_ms") else ""),
                      str(g["held_background"]), str(g["held_interactive"]),
                      str(g["delayed"]), str(g["inflight"]),
                      ("-" if g["cap"] is None else str(g["cap"])) + cap_mark,
                      f"{g['weight']:g}{weight_mark}{boost_text(g)}"
                      + (f" rate {g['rate']}" if g.get("rate") else ""), *wait)
    return table
