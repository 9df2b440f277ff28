"""``python -m bench commands``: the Redis commands each script of a task's path runs per
task (issue 17), counted with ``INFO commandstats`` deltas on a redis-server of its own
(a ``redis.call`` inside a script counts there as the command it runs).

A task's path: ``hold`` (the publisher; its round trip also registers the queue, one
``SADD``, counted with it), ``pick`` (the dispatcher, batches of ``--batch``), ``confirm``
(the dispatcher, once the broker took the batch), ``begin`` and ``release`` (the worker,
release with the production ``fair_done_ttl``), the store's own calls as production makes
them, production defaults otherwise. Scenarios: ``backlog``, ``--tasks`` messages over 10
groups, all held first (10 groups backlogged); ``own``, every message from a group of its
own; ``capped``, ``backlog`` with a default cap of 2 (so a release makes its group
eligible again). For each script: commands per task (the ``EVALSHA`` itself not counted),
the commands it ran most, and Redis's time in it per task (µs, the ``EVALSHA``'s)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from typing import Any

import redis

from celery_fair.envelope import BACKGROUND, Envelope
from celery_fair.settings import SETTINGS
from celery_fair.store.base import Placement, Policy
from celery_fair.store.redis import RedisStore
from celery_fair.testing import RedisServer

Q = "cmds"
NOW = 1_700_000_000_000
SCRIPTS = ("hold", "pick", "confirm", "begin", "release")
DEFAULTS = {s.name: s.default for s in SETTINGS}
SCENARIOS = {"backlog": (10, None), "own": (0, None), "capped": (10, 2)}


class Meter:
    """Commandstats deltas, added up per script."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.calls: dict[str, Counter[str]] = {name: Counter() for name in SCRIPTS}
        self.usec: Counter[str] = Counter()

    def _stats(self) -> dict[str, dict[str, Any]]:
        return {k.removeprefix("cmdstat_"): v
                for k, v in self.client.info("commandstats").items()}

    def measure(self, name: str, work: Any) -> Any:
        before = self._stats()
        result = work()
        after = self._stats()
        for cmd, row in after.items():
            old = before.get(cmd, {"calls": 0, "usec": 0})
            delta = row["calls"] - old["calls"]
            if cmd == "info":
                continue
            if cmd == "evalsha":
                self.usec[name] += row["usec"] - old["usec"]
            elif delta:
                self.calls[name][cmd] += delta
        return result


def run(scenario: str, tasks: int, batch: int) -> dict[str, Any]:
    groups, cap = SCENARIOS[scenario]
    server = RedisServer()
    try:
        client = redis.Redis(port=server.port)
        store = RedisStore(client, "bench")
        store.configure(Q, Policy(cap, DEFAULTS["fair_interactive_reserve"], 1.0, {}, {}))
        meter = Meter(client)
        for i in range(tasks):
            group = f"g{i % groups}" if groups else f"own{i}"
            envelope = Envelope(body=b"[[], {}, {}]", content_type="application/json",
                                content_encoding="utf-8",
                                headers={"id": f"t{i}", "task": "proj.work"}, exchange="",
                                routing_key=Q, queue=Q)
            data = envelope.encode(group, BACKGROUND, 1, False)
            meter.measure("hold", lambda i=i, g=group, d=data: store.hold(
                Q, f"t{i}", d, Placement(g, BACKGROUND, 1, False), 0, NOW))
        done, lease = 0, DEFAULTS["fair_lease_seconds"] * 1000
        while done < tasks:
            picked = meter.measure("pick", lambda: store.pick(Q, batch, None, NOW, lease))
            assert picked, f"nothing picked after {done} of {tasks}"
            ids = [p.dispatch_id for p in picked]
            meter.measure("confirm", lambda ids=ids: store.confirm(Q, ids, NOW + lease))
            for did in ids:
                meter.measure("begin", lambda did=did: store.begin_run(
                    Q, did, NOW + lease, now_ms=NOW, run=f"host:1:{did}", acks_late=False,
                    host="host:1:"))
            for did in ids:
                meter.measure("release", lambda did=did: store.release(
                    Q, did, DEFAULTS["fair_done_ttl"], run=f"host:1:{did}"))
            done += len(ids)
        return {name: {"commands_per_task": round(sum(meter.calls[name].values()) / tasks, 2),
                       "usec_per_task": round(meter.usec[name] / tasks, 2),
                       "top": {c: round(n / tasks, 2)
                               for c, n in meter.calls[name].most_common(8) if n}}
                for name in SCRIPTS}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench commands", description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=DEFAULTS["fair_batch_size"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    args = parser.parse_args(argv)
    results = {s: run(s, args.tasks, args.batch) for s in args.scenarios}
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        print()
        return 0
    for scenario, rows in results.items():
        print(f"{scenario} ({args.tasks} tasks, batches of {args.batch}):")
        total = 0.0
        for name, row in rows.items():
            total += row["commands_per_task"]
            top = ", ".join(f"{c} {n}" for c, n in row["top"].items())
            print(f"  {name:8} {row['commands_per_task']:6} commands/task "
                  f"{row['usec_per_task']:7} µs/task  ({top})")
        print(f"  {'total':8} {round(total, 2):6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
