"""Two workers with one hostname in two PID namespaces (containers on the host network,
compose ``hostname:``, Kubernetes ``hostNetwork``) do not take each other's live runs over.

A run is named by its host, boot and PID namespace (``celery_fair/host.py``); a pid seen
from another PID namespace means nothing, so a run there is never concluded gone. Real
namespaces: the second worker runs under ``unshare --pid --fork --mount-proc`` (root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
from celery import Celery

from .conftest import DispatcherThread
from .test_worker_crash import copy_redelivered_while_the_task_runs

UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc")


def _can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare for a PID namespace")
def test_a_worker_in_another_pid_namespace_with_the_same_hostname_does_not_take_a_live_run_over(
        make_app: Callable[..., Celery], dispatcher: Callable[..., DispatcherThread],
        redis_server: Any, namespace: str, tmp_path: Path) -> None:
    # The second worker shares the hostname, not the PID namespace: the first worker's
    # pool pid does not exist there. Unfixed, it took the run over: {'long': 2}.
    copy_redelivered_while_the_task_runs(make_app, dispatcher, redis_server, namespace,
                                         tmp_path, wrap=UNSHARE)
