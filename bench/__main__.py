"""``python -m bench {all|SCENARIO...|report} [--quick] [--reps N]``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from . import fairness, throughput
from .harness import RESULTS, Bench

SCENARIOS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "hold": throughput.hold,
    "dispatch": throughput.dispatch,
    "end_to_end": throughput.end_to_end,
    "idle_latency": throughput.idle_latency,
    "small_tenant": fairness.small_tenant,
    "share": fairness.share,
    "groups": fairness.groups,
    "held": fairness.held,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("what", nargs="+", help="all, report, or scenarios: "
                        + ", ".join(SCENARIOS))
    parser.add_argument("--quick", action="store_true", help="smaller workloads")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.what == ["report"]:
        from .report import write_report

        print(write_report())
        return 0
    names = list(SCENARIOS) if args.what == ["all"] else args.what
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(SCENARIOS)}")
    if args.what == ["all"]:
        (RESULTS / "latest.jsonl").unlink(missing_ok=True)
    bench = Bench(quick=args.quick, reps=args.reps)
    try:
        for name in names:
            SCENARIOS[name](bench)
    finally:
        bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
