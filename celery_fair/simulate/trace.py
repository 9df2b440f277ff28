"""Reading a workload trace (``fair simulate TRACE``): a CSV file with a header, or JSON
lines, one task per row. Columns: ``at`` (seconds from the start), ``group``, optionally
``subgroup``, ``cost`` (default 1), ``duration`` (seconds) and ``interactive`` (default
false). Every bad value is refused naming the file, the line and the column."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FairError
from ..names import validate_group

__all__ = ["BadTrace", "TraceTask", "read_trace"]

_TRUE, _FALSE = {"1", "true", "yes", "y", "t"}, {"0", "false", "no", "n", "f", ""}


class BadTrace(FairError, ValueError):
    """A trace file that cannot be read as a workload."""


@dataclass(frozen=True)
class TraceTask:
    """One task of a trace: when it is published, its group, declared cost, how long it
    runs and its class."""

    at: float
    group: str
    cost: float
    duration: float
    interactive: bool
    subgroup: str | None = None


def read_trace(path: str | Path) -> list[TraceTask]:
    """The tasks of the trace at ``path``, in publication order (ties: file order).

    Raises:
        BadTrace: the file is missing, empty, or a row is invalid (named by line and
            column).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadTrace(f"trace {path}: cannot be read ({exc.strerror})") from None
    rows = list(_json_rows(path, text) if _is_jsonl(path, text) else _csv_rows(path, text))
    if not rows:
        raise BadTrace(f"trace {path}: no tasks (expected a CSV header and rows, or JSON "
                       "lines, with at, group, duration)")
    tasks = [_task(path, line, row) for line, row in rows]
    return sorted(tasks, key=lambda t: t.at)  # stable: file order among equal times


def _is_jsonl(path: Path, text: str) -> bool:
    return path.suffix in (".jsonl", ".json", ".ndjson") or text.lstrip().startswith("{")


def _json_rows(path: Path, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadTrace(f"trace {path} line {line}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise BadTrace(f"trace {path} line {line}: expected a JSON object, got "
                           f"{type(row).__name__}")
        yield line, row


def _csv_rows(path: Path, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(text.splitlines())
    missing = {"at", "group", "duration"} - set(reader.fieldnames or ())
    if missing:
        raise BadTrace(f"trace {path}: the CSV header lacks {', '.join(sorted(missing))} "
                       f"(it has {', '.join(reader.fieldnames or ()) or 'nothing'})")
    for row in reader:
        yield reader.line_num, row


def _task(path: Path, line: int, row: dict[str, Any]) -> TraceTask:
    where = f"trace {path} line {line}"
    try:
        group = validate_group(_required(row, "group", where))
        subgroup = row.get("subgroup") or None
        if subgroup is not None:
            subgroup = validate_group(subgroup)
    except ValueError as exc:
        raise BadTrace(f"{where}: {exc}") from None
    return TraceTask(at=_number(row, "at", where, 0.0, None),
                     group=group,
                     cost=_number(row, "cost", where, None, 1.0),
                     duration=_number(row, "duration", where, 0.0, None),
                     interactive=_flag(row, "interactive", where),
                     subgroup=subgroup)


def _required(row: dict[str, Any], column: str, where: str) -> Any:
    value = row.get(column)
    if value is None or value == "":
        raise BadTrace(f"{where}: column {column!r} is missing")
    return value


def _number(row: dict[str, Any], column: str, where: str, minimum: float | None,
            default: float | None) -> float:
    """A finite number >= ``minimum`` (None: > 0), or ``default`` when absent."""
    value = row.get(column)
    if (value is None or value == "") and default is not None:
        return default
    value = _required(row, column, where)
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or (number < minimum if minimum is not None
                                     else number <= 0):
        bound = f">= {minimum:g}" if minimum is not None else "> 0"
        raise BadTrace(f"{where}: column {column!r} must be a finite number {bound}, "
                       f"got {value!r}")
    return number


def _flag(row: dict[str, Any], column: str, where: str) -> bool:
    value = row.get(column, False)
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in _TRUE | _FALSE:
        return str(value).strip().lower() in _TRUE
    raise BadTrace(f"{where}: column {column!r} must be true or false, got {value!r}")
