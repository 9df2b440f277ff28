"""``fair check``'s findings as Prometheus metrics, in a text file a collector serves.

A check reads every key of a fair queue, so it runs now and then (a cron job, a systemd
timer), not at every scrape. ``celery -A proj fair check --metrics-file PATH`` writes its
findings where node_exporter's textfile collector (``--collector.textfile.directory``)
picks them up; the file is replaced atomically, so a scrape never sees half of it. The
alert rules in ``docs/monitoring/alerts.yml`` read:

- ``celery_fair_check_findings{queue,kind}``: findings of the last run, repaired or not
  (a repaired leak still says something leaked); the slot kinds are always present, 0
  when none was found, so an alert on them resolves instead of going absent;
- ``celery_fair_check_unrepaired{queue}``: findings left as they were;
- ``celery_fair_check_last_run_timestamp_seconds``: when the file was written (an alert
  on its age says the check stopped running, so its silence means nothing).
"""

from __future__ import annotations

import os
import time

from .check import Report
from .errors import ConfigurationError

#: Findings that mean a slot is counted wrong: the in-flight counters disagree with the
#: dispatch records (a slot that never comes back, or a cap that overshoots), or an
#: in-flight dispatch has no lease (its slot would never be reclaimed).
SLOT_KINDS = ("group_inflight", "queue_inflight", "dispatch_without_lease")


def write_metrics_file(report: Report, path: str, now: float | None = None) -> None:
    """Write ``report`` to ``path`` in Prometheus' text format (atomically).

    Raises:
        ConfigurationError: the directory of ``path`` does not exist.
    """
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ConfigurationError(
            f"--metrics-file {path!r}: directory {directory!r} does not exist (expected the "
            "textfile collector's directory, e.g. node_exporter's "
            "--collector.textfile.directory)")
    registry = CollectorRegistry()
    findings = Gauge("celery_fair_check_findings",
                     "Findings of the last `fair check` run, repaired or not, per kind.",
                     ["queue", "kind"], registry=registry)
    unrepaired = Gauge("celery_fair_check_unrepaired",
                       "Findings the last `fair check` run left as they were.", ["queue"],
                       registry=registry)
    Gauge("celery_fair_check_last_run_timestamp_seconds",
          "When `fair check` last wrote this file (epoch seconds).",
          registry=registry).set(time.time() if now is None else now)
    for queue in report.queues:
        unrepaired.labels(queue).set(0)
        for kind in SLOT_KINDS:
            findings.labels(queue, kind).set(0)
    for finding in report.findings:
        findings.labels(finding.queue, finding.kind).inc()
    for finding in report.problems:
        unrepaired.labels(finding.queue).inc()
    write_to_textfile(path, registry)
