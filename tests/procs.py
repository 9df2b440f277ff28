"""Subprocess helpers: ``celery -A tests.proj ...`` workers and dispatchers for the tests.

Each process runs in its own session (process group), so a test can SIGKILL a worker
together with its pool children, and logs to a file the test can show when it fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .conftest import subprocess_env

ROOT = Path(__file__).resolve().parent.parent
CELERY = str(Path(sys.executable).with_name("celery"))


class CeleryProcess:
    """One ``celery -A tests.proj <args>`` subprocess in its own process group."""

    def __init__(self, args: list[str], conf: dict[str, Any], broker: str, namespace: str,
                 log: Path, store: str | None = None, wrap: tuple[str, ...] = ()) -> None:
        """``wrap``: a command the worker runs under (``unshare --pid --fork ...``)."""
        self.args = args
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*wrap, CELERY, "-A", "tests.proj", *args], cwd=ROOT,
            env=subprocess_env(conf, broker, namespace, store), stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill_group(self) -> None:
        """SIGKILL the process and every process of its group (pool children)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM, then SIGKILL the group if it does not exit in time; returns the code."""
        code = self.proc.poll()
        if code is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill_group()
                code = None
        # pool children left behind by a killed parent
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._log.close()
        return code

    def stacks(self, timeout: float = 10) -> str:
        """Every thread's stack of a process that hangs (faulthandler prints them on
        SIGABRT, see ``subprocess_env``), with the rest of its output."""
        try:
            self.proc.send_signal(signal.SIGABRT)
            self.proc.wait(timeout)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        return self.output(tail=20000)

    def output(self, tail: int = 6000) -> str:
        if not self._log.closed:
            self._log.flush()
        text = self.log_path.read_bytes().decode(errors="replace")
        return f"--- {' '.join(self.args)} (pid {self.pid}) ---\n{text[-tail:]}"


@contextmanager
def stopped_after(procs: Mapping[str, CeleryProcess]) -> Iterator[None]:
    """Stop every process of ``procs`` (read at the end: it may grow) when the block
    ends; print their output first when it failed."""
    try:
        yield
    except BaseException:
        for proc in procs.values():
            print(proc.output())
        raise
    finally:
        for proc in procs.values():
            proc.stop()
