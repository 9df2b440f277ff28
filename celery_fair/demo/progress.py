"""The demo's progress on stderr: a rich bar, one rewritten line, or nothing (``--json``)."""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """Shows tasks done / total of the current run; this base class shows nothing."""

    def begin(self, title: str, total: int) -> None:
        self.title, self.total = title, total

    def update(self, done: int) -> None:
        pass

    def end(self) -> None:
        pass

    def close(self) -> None:
        pass


class LineProgress(Progress):
    """One line on stderr, rewritten in place."""

    def update(self, done: int) -> None:
        sys.stderr.write(f"\r{self.title}: {done}/{self.total} tasks done")
        sys.stderr.flush()

    def end(self) -> None:
        sys.stderr.write("\n")


class RichProgress(Progress):
    """A rich progress bar on stderr."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bar

        self.bar = Bar(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("tasks"), TimeElapsedColumn(),
                       console=Console(stderr=True))
        self.task: Any = None

    def begin(self, title: str, total: int) -> None:
        super().begin(title, total)
        if self.task is None:
            self.bar.start()
        self.task = self.bar.add_task(title, total=total)

    def update(self, done: int) -> None:
        self.bar.update(self.task, completed=done)

    def end(self) -> None:
        self.bar.refresh()

    def close(self) -> None:
        self.bar.stop()


def make_progress(as_json: bool) -> Progress:
    if as_json:
        return Progress()
    try:
        return RichProgress()
    except ImportError:
        return LineProgress()
