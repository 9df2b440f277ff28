"""Which processes this process can judge: its host, boot and PID namespace.

A run (``lifecycle.new_run``) and a spool file (``spool.py``) name their process by pid, and
"its process is gone" is concluded with ``kill(pid, 0)``. A pid means something only in
the PID namespace it was given in, during one boot: containers that share a hostname but
not a PID namespace (``network_mode: host``, compose ``hostname:``, Kubernetes
``hostNetwork``) would each see the other's live processes as dead. So a run names its
host, boot and PID namespace too, and only runs of this very one are ever judged here.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

#: Where Linux tells the boot and the PID namespace apart. Without /proc (not Linux) there
#: are no PID namespaces, and the hostname alone tells hosts apart.
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
PID_NAMESPACE = Path("/proc/self/ns/pid")


def _boot_id() -> str:
    try:
        return BOOT_ID.read_text(encoding="ascii").strip().replace("-", "")[:16]
    except OSError:
        return "-"


def _pid_namespace() -> str:
    try:
        return str(os.stat(PID_NAMESPACE).st_ino)
    except OSError:
        return "-"


def identity() -> str:
    """``hostname/boot/pidns``: processes of one identity can see each other's pids."""
    return f"{socket.gethostname()}/{_boot_id()}/{_pid_namespace()}"


def start_time(pid: int | None = None) -> str:
    """When process ``pid`` (None: this one) started, in clock ticks since boot; '' when
    unknown. A pid is reused after its process ends; a start time is not."""
    try:
        stat = Path(f"/proc/{'self' if pid is None else pid}/stat").read_text(encoding="ascii")
        return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name may hold spaces
    except (OSError, IndexError, ValueError):
        return ""


def pid_alive(pid: int, started: str = "") -> bool:
    """Whether process ``pid`` of this PID namespace exists; with ``started`` (its
    :func:`start_time`), whether it is still that process and not a later one that was
    given the same pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, someone else's
        pass
    if started:
        now = start_time(pid)
        return now in ("", started)
    return True
