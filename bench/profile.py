"""``python -m bench.profile {hold,bulk,dispatch,pick} [--store S] [-n N] [--groups G]``:
cProfile of the fair ``delay()``, of ``fair_bulk`` (N tasks over 10 tenants, as ``python
-m bench bulk``), of the dispatcher's steps, or of the store's ``pick`` (500 at a time,
over G backlogged groups) on a store, as the benchmark runs them (same harness, same
broker), printing the top costs by own time and by cumulative time.
For whoever optimizes a store: the benchmark says how fast, this says where the time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

from celery_fair.dispatcher import Dispatcher
from celery_fair.task import store_for

from .harness import Bench, captured_envelope, prefill
from .sqlstores import STORES


def profile_hold(bench: Bench, n: int) -> cProfile.Profile:
    task = bench.app().tasks["proj.fair"]
    task.delay("warm")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(n):
        task.delay("acme")
    profiler.disable()
    return profiler


def profile_bulk(bench: Bench, n: int) -> cProfile.Profile:
    task = bench.app().tasks["proj.fair"]
    task.delay("warm")
    items = [(f"t{i % 10}",) for i in range(n)]
    profiler = cProfile.Profile()
    profiler.enable()
    results = task.fair_bulk(items)
    profiler.disable()
    del results
    return profiler


def profile_dispatch(bench: Bench, n: int) -> cProfile.Profile:
    app = bench.app(fair_max_inflight=10**9, fair_batch_size=500, fair_direct_push=False,
                    fair_lease_seconds=3600)  # as the dispatch scenario
    queue = app.conf.task_default_queue
    prefill(store_for(app), queue, captured_envelope(app), [f"g{i}" for i in range(100)],
            n // 100)
    dispatcher = Dispatcher(app)
    profiler = cProfile.Profile()
    moved = 0
    profiler.enable()
    while moved < n:
        moved += dispatcher.step().dispatched
    profiler.disable()
    dispatcher.close()
    bench.drop_queue(app, queue)
    return profiler


def profile_pick(bench: Bench, n: int, groups: int) -> cProfile.Profile:
    app = bench.app()
    store, queue = store_for(app), app.conf.task_default_queue
    prefill(store, queue, captured_envelope(app), [f"g{i}" for i in range(groups)],
            max(2, n // groups + 1))
    profiler = cProfile.Profile()
    taken = 0
    profiler.enable()
    while taken < n:
        taken += len(store.pick(queue, 500, None, int(time.time() * 1000), 600_000))
    profiler.disable()
    return profiler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("what", choices=("hold", "bulk", "dispatch", "pick"))
    parser.add_argument("--store", choices=STORES, default="postgresql")
    parser.add_argument("-n", type=int, default=2000, help="tasks (default 2,000)")
    parser.add_argument("--groups", type=int, default=10000, help="pick: backlogged "
                        "groups (default 10,000)")
    parser.add_argument("--top", type=int, default=25, help="rows per listing")
    args = parser.parse_args(argv)
    bench = Bench(store=args.store)
    try:
        if args.what == "pick":
            profiler = profile_pick(bench, args.n, args.groups)
        else:
            run = {"hold": profile_hold, "bulk": profile_bulk}.get(args.what,
                                                                  profile_dispatch)
            profiler = run(bench, args.n)
        stats = pstats.Stats(profiler, stream=sys.stdout)
    finally:
        bench.close()
    print(f"== {args.what} on {args.store}, {args.n} tasks: by own time")
    stats.sort_stats("tottime").print_stats(args.top)
    print(f"== {args.what} on {args.store}, {args.n} tasks: by cumulative time")
    stats.sort_stats("cumulative").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
