"""celery-fair benchmarks: each scenario against plain Celery in the same run.

``python -m bench all`` runs every scenario (``--quick`` for a smaller, faster run) and
prints one JSON line per scenario; ``python -m bench report`` writes docs/benchmarks.md
and a fairness timeline chart from the last run's results.
"""
