"""How ``celery fair status`` and ``celery fair groups`` look: rich views and the watch loop.

The commands (cli.py) read the store; this module only turns what they read into text.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import click


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
    """The ``status`` view: per queue, its totals and its busiest groups."""
    from rich.console import Group
    from rich.text import Text

    if not queues:
        return Text("no fair queues yet (nothing has been held)")
    parts: list[Any] = []
    for q in queues:
        held = q["held_interactive"] + q["held_background"]
        parts.append(Text(
            f"queue {q['queue']}: {held} held ({q['held_interactive']} interactive), "
            f"{q['delayed']} delayed, {_inflight(q)} in flight, "
            f"{q['group_count']} groups with work, {q['released']} released"))
        parts.extend(_liveness(q))
        if q["groups"]:
            parts.append(_group_table(q["groups"]))
        if q["more_groups"]:
            parts.append(Text(f"... and {q['more_groups']} more groups "
                              f"(celery fair groups --queue {q['queue']})"))
    return Group(*parts)


def _liveness(q: dict[str, Any]) -> list[Any]:
    """The queue's live dispatchers, one line each; or, with held work and none, a red
    warning naming the command that starts one (``liveness.py``)."""
    from rich.text import Text

    from .liveness import ago
    from .store.base import now_ms

    if q.get("warning"):
        return [Text(f"WARNING: {q['warning']}", style="bold red")]
    now = now_ms()
    return [Text(f"  dispatcher {d['host']} pid {d['pid']}: last step "
                 f"{ago(now - d['last_step_ms']) + ' ago' if d['last_step_ms'] else 'none yet'}",
                 style="dim") for d in q.get("dispatchers", ())]


def _inflight(q: dict[str, Any]) -> str:
    """In flight against the workers' slots, with the dispatch-ahead allowance apart:
    "6 / 4 (+2 ahead)" is within the limit, not a broken cap."""
    ahead = f" (+{q['dispatch_ahead']} ahead)" if q["dispatch_ahead"] else ""
    return f"{q['inflight']} / {q['capacity']}{ahead}"


def render_groups(queues: list[dict[str, Any]]) -> Any:
    """The ``groups`` view: one table per queue."""
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = []
    for q in queues:
        parts.append(Text(f"queue {q['queue']}: {q['group_count']} groups with work"))
        if q["groups"]:
            parts.append(_group_table(q["groups"]))
    return Group(*parts) if parts else Text("no fair queues yet (nothing has been held)")


def _group_table(rows: list[dict[str, Any]]) -> Any:
    from rich import box
    from rich.table import Table

    limited = any(g["limited"] for g in rows)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  caption="* runtime limit (celery fair limit)" if limited else None,
                  caption_justify="left")
    for name in ("group", "held", "interactive", "delayed", "in flight", "cap", "weight"):
        table.add_column(name, justify="left" if name == "group" else "right")
    for g in rows:
        cap_mark = " *" if "cap" in g["limited"] else ""
        weight_mark = " *" if "weight" in g["limited"] else ""
        table.add_row(g["group"], str(g["held_background"]), str(g["held_interactive"]),
                      str(g["delayed"]), str(g["inflight"]),
                      ("-" if g["cap"] is None else str(g["cap"])) + cap_mark,
                      f"{g['weight']:g}{weight_mark}")
    return table
