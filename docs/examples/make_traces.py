"""Writes the two example traces of ``fair simulate`` (docs/policies.md): run it again to
get them byte for byte (no randomness)."""

from __future__ import annotations

import csv
from pathlib import Path

HERE = Path(__file__).parent
COLUMNS = ["at", "group", "cost", "duration", "interactive"]


def noisy_neighbour() -> list[list[object]]:
    """One tenant uploads 2,000 jobs of 50 ms at once; five small tenants send a job of
    50 ms every 2 s each (one an interactive preview), over the same minute."""
    rows: list[list[object]] = [[0.0, "bigcorp", 1, 0.05, "false"] for _ in range(2000)]
    for i, tenant in enumerate(["acme", "globex", "initech", "umbrella", "hooli"]):
        for k in range(12):
            rows.append([round(0.3 * i + 2.0 * k, 3), tenant, 1, 0.05,
                         "true" if tenant == "hooli" else "false"])
    return sorted(rows, key=lambda r: float(str(r[0])))


def mixed_durations() -> list[list[object]]:
    """Two backlogged tenants: reports of 10 ms (3,000) and exports of 100 ms (600), the
    exports declared ``fair_cost=10``: counting dispatches gives exports ten times the
    worker time of reports; charging the declared cost evens it out."""
    rows: list[list[object]] = [[0.0, "reports", 1, 0.01, "false"] for _ in range(3000)]
    rows += [[0.0, "exports", 10, 0.1, "false"] for _ in range(600)]
    return rows


def main() -> None:
    for name, rows in (("noisy-neighbour", noisy_neighbour()),
                       ("mixed-durations", mixed_durations())):
        with open(HERE / f"{name}.csv", "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(COLUMNS)
            writer.writerows(rows)


if __name__ == "__main__":
    main()
