"""The policy simulator (``celery -A proj fair simulate TRACE``, ``python -m
celery_fair.simulate TRACE``): replay a workload trace through the real policy with a
virtual clock and N virtual worker slots, and compare policies before deploying one::

    from celery_fair.simulate import figures, read_trace, simulate

    tasks = read_trace("docs/examples/noisy-neighbour.csv")
    for policy in ("fifo", "wfq"):
        print(figures(simulate(tasks, slots=4, policy=policy)))
"""

from .engine import CHARGES, POLICIES, BadSimulation, Run, simulate
from .report import GroupFigures, RunFigures, figures, plot, render
from .trace import BadTrace, TraceTask, read_trace

__all__ = ["CHARGES", "POLICIES", "BadSimulation", "BadTrace", "GroupFigures", "Run",
           "RunFigures", "TraceTask", "figures", "plot", "read_trace", "render", "simulate"]
