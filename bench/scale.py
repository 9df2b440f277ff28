"""``python -m bench scale [--quick]``: the store on one redis-server against the store on a
Redis Cluster of 3 primaries (each with a replica), in one run (issue 15, item 6).

Every part is a process of its own: the dispatchers (``celery -A bench.scale_proj fair
dispatch --shard i/n``), the workers (threads pool), each redis-server. The dispatched
messages go through kombu to a broker redis-server of their own on both sides
(``fair_direct_push`` off: a cluster has none), so the sides differ only in the store;
the single node with direct push (the broker is then the store's Redis) is a third line
for reference.

- **Dispatch**: N fair queues prefilled with held no-op tasks over 10 groups each, no
  worker; then K dispatchers start, each serving its share. The rate is counted in the
  broker's lists from 10 % to 90 % of the tasks moved (the processes' start-up is outside
  the window), and the CPU of every process (/proc/<pid>/stat, as ``bench cpu``) over
  that same window, in µs per dispatch.
- **Drain**: the same, with 2 worker processes (threads, 8 each) running the tasks;
  tasks/s counted from inside the tasks, from 10 % to 90 % done.
- **Growth**: queues 1, 4, 8 (16 in a full run) × one node (one dispatcher) or the
  cluster (3 dispatchers).

Queue names are chosen so that queue i falls on shard i mod n of the dispatchers and on
primary i mod 3 of the cluster: dispatcher i then talks to one primary only, the best
case of ``--shard``; a real deployment's names spread by chance.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from celery_fair.task import store_for
from celery_fair.testing import ClusterTopology, RedisServer

from . import harness
from .cpu import CELERY, ROOT, cpu_seconds, stop_all
from .harness import captured_envelope, commit, machine, prefill
from .scale_proj import make_app

GROUPS = 10  # per queue


@dataclass(frozen=True)
class Size:
    tasks: int
    drain_tasks: int
    queues: int
    dispatchers: tuple[int, ...]
    growth: tuple[int, ...]


SIZES = {"full": Size(20_000, 10_000, 8, (1, 2, 3), (1, 4, 8, 16)),
         "quick": Size(6_000, 3_000, 8, (1, 2, 3), (1, 4, 8)),
         "smoke": Size(600, 300, 2, (2,), (1,))}


@dataclass(frozen=True)
class Side:
    """Where a measure keeps its store and sends its messages."""

    name: str
    store_url: str  # "" for the broker's Redis (direct push)
    broker: RedisServer
    store_pids: tuple[int, ...]
    direct: bool
    flush: Callable[[], None]
    primary_pids: tuple[int, ...] = ()  # of a cluster: its primaries (replicas apart)


class Servers:
    """The run's redis-servers: a single store node, a broker, a counter, the cluster."""

    def __init__(self) -> None:
        self.single, self.broker, self.counter = RedisServer(), RedisServer(), RedisServer()
        try:
            self.cluster = ClusterTopology()
        except BaseException:
            self.stop()
            raise
        primaries = self.cluster.primaries()
        self.slots = {port: ranges for port, ranges in _slot_ranges(primaries[0]).items()}
        self.primaries = primaries

    def sides(self) -> dict[str, Side]:
        cluster_pids = tuple(s.proc.pid for s in self.cluster.servers)
        primary_pids = tuple(s.proc.pid for s in self.cluster.servers
                             if s.port in self.primaries)
        return {
            "single": Side("single", self.single.url + "/0", self.broker,
                           (self.single.proc.pid,), False, self.flush),
            "cluster": Side("cluster", self.cluster.store_url, self.broker, cluster_pids,
                            False, self.flush, primary_pids),
            "single_direct": Side("single_direct", "", self.single, (self.single.proc.pid,),
                                  True, self.flush)}

    def flush(self) -> None:
        for port in [self.single.port, self.broker.port, self.counter.port, *self.primaries]:
            redis.Redis(port=port).flushall()

    def stop(self) -> None:
        for server in (self.single, self.broker, self.counter):
            server.stop()
        if hasattr(self, "cluster"):
            self.cluster.stop()


def _slot_ranges(port: int) -> dict[int, list[tuple[int, int]]]:
    out: dict[int, list[tuple[int, int]]] = {}
    for row in redis.Redis(port=port).cluster("SLOTS"):
        out.setdefault(int(row[2][1]), []).append((int(row[0]), int(row[1])))
    return out


def queue_names(ns: str, count: int, servers: Servers) -> list[str]:
    """``count`` queue names, queue i on dispatcher shard i mod n (n = 1, 2, 3: crc32 mod
    6) and on the cluster's primary i mod 3."""
    names: list[str] = []
    candidate = 0
    while len(names) < count:
        i = len(names)
        name = f"{ns}-q{candidate}"
        candidate += 1
        slot = key_slot(name.encode())
        port = servers.primaries[i % len(servers.primaries)]
        if zlib.crc32(name.encode()) % 6 == i % 6 and any(
                lo <= slot <= hi for lo, hi in servers.slots[port]):
            names.append(name)
    return names


class Measure:
    """One measure's processes (dispatchers, workers) and environment."""

    def __init__(self, side: Side, counter: RedisServer, workdir: Path, held: bool) -> None:
        self.side, self.workdir = side, workdir
        self.ns = "s" + uuid.uuid4().hex[:8]
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "SCALE_NS": self.ns,
                    "SCALE_BROKER": side.broker.url + "/0", "SCALE_STORE": side.store_url,
                    "SCALE_DIRECT": "1" if side.direct else "0",
                    "SCALE_HELD": "1" if held else "0",
                    "SCALE_COUNTER": counter.url + "/0"}
        self.counter = redis.Redis.from_url(counter.url + "/0")
        self.broker = redis.Redis(port=side.broker.port)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def fill(self, queues: list[str], tasks: int) -> None:
        app = make_app(self.env)
        store = store_for(app)
        try:
            for queue in queues:
                envelope = captured_envelope(app, ("g",), "scale.fair", queue)
                prefill(store, queue, envelope, [f"g{i}" for i in range(GROUPS)],
                        tasks // len(queues) // GROUPS)
        finally:
            store.close()

    def start(self, name: str, *args: str) -> None:
        log = open(self.workdir / f"{self.ns}-{name}.log", "ab")  # noqa: SIM115 - the child's
        self.procs[name] = subprocess.Popen([CELERY, "-A", "bench.scale_proj", *args],
                                            cwd=ROOT, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def dispatchers(self, count: int) -> None:
        for i in range(count):
            shard = ["--shard", f"{i}/{count}"] if count > 1 else []
            self.start(f"dispatcher{i}", "fair", "dispatch", *shard)

    def workers(self, count: int, queues: list[str]) -> None:
        for i in range(count):
            self.start(f"worker{i}", "worker", "-P", "threads", "-c", "8",
                       "--prefetch-multiplier", "1", "-Q", ",".join(queues), "-n",
                       f"w{i}-{self.ns}@scale", "-l", "WARNING", "--without-heartbeat",
                       "--without-gossip", "--without-mingle")

    def in_broker(self, queues: list[str]) -> int:
        pipe = self.broker.pipeline(transaction=False)
        for queue in queues:
            pipe.llen(queue)
        return sum(pipe.execute())

    def done(self) -> int:
        return int(self.counter.get(self.ns + ":done") or 0)

    def cpu(self) -> dict[str, float]:
        out = {"store": sum(cpu_seconds(pid) for pid in self.side.store_pids)}
        if self.side.primary_pids:
            out["primaries"] = sum(cpu_seconds(pid) for pid in self.side.primary_pids)
        if not self.side.direct:
            out["broker"] = cpu_seconds(self.side.broker.proc.pid)
        for role in ("dispatcher", "worker"):
            out[role] = sum(cpu_seconds(p.pid) for n, p in self.procs.items()
                            if n.startswith(role))
        return out

    def window(self, count: Callable[[], int], n: int) -> dict[str, Any]:
        """Rate and CPU µs per task from 10 % to 90 % of ``n`` counted (from the start
        when all moved before the first look); below 5 tasks/s, an error naming the count
        and the dispatchers' last lines, before pytest's timeout hides where it stopped."""
        deadline = time.monotonic() + min(600.0, max(120.0, n / 5))
        start = (time.monotonic(), count(), self.cpu())
        marks: list[tuple[float, int, dict[str, float]]] = []
        for threshold in (max(1, n // 10), n * 9 // 10):
            while (counted := count()) < threshold:
                self._check(deadline, counted, n)
                time.sleep(0.002)
            marks.append((time.monotonic(), counted, self.cpu()))
        if marks[1][1] == marks[0][1]:
            # Everything moved before the first look (a loaded machine polls late): the
            # window runs from the start instead. Waiting for more than all of them, as
            # this did, waited until the deadline (a CI smoke run: 600 of 600 counted).
            marks[0] = start
        if marks[1][1] == marks[0][1]:
            raise RuntimeError(f"all {n} counted before the measure started: no window")
        (t0, c0, cpu0), (t1, c1, cpu1) = marks
        moved = c1 - c0
        return {"per_s": round(moved / (t1 - t0), 1),
                "us_cpu": {k: round((cpu1[k] - cpu0[k]) / moved * 1e6) for k in cpu1
                           if k != "worker" or self.procs.keys() & {"worker0"}}}

    def _check(self, deadline: float, counted: int, n: int) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"the {name} exited ({proc.returncode}); see "
                                   f"{self.workdir / f'{self.ns}-{name}.log'}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {name} ---\n" + (self.workdir / f"{self.ns}-{name}.log")
                             .read_text(errors="replace")[-2000:]
                             for name in self.procs if name.startswith("dispatcher"))
            raise TimeoutError(f"only {counted} of {n} counted in time\n{logs}")

    def stop(self) -> None:
        stop_all(self.procs.values())
        self.side.flush()


def measure(servers: Servers, side: Side, queue_count: int, dispatchers: int, tasks: int,
            workdir: Path, workers: int = 0) -> dict[str, Any]:
    """Dispatches/s (``workers`` 0) or tasks/s drained, and µs CPU per task of each part."""
    run = Measure(side, servers.counter, workdir, held=not workers)
    queues = queue_names(run.ns, queue_count, servers)
    try:
        run.fill(queues, tasks)
        n = tasks // queue_count // GROUPS * queue_count * GROUPS
        if workers:
            run.workers(workers, queues)
        run.dispatchers(dispatchers)
        figures = run.window(run.done if workers else lambda: run.in_broker(queues), n)
    finally:
        run.stop()
    return {"store": side.name, "queues": queue_count, "dispatchers": dispatchers,
            "tasks": n, **figures}


def run(size: str = "quick", results: Path | None = None) -> dict[str, Any]:
    """Every measure; the row is appended to ``results``/scale.jsonl (by default
    bench/results, looked up at the call so that a test's redirection holds)."""
    results = results or harness.RESULTS
    plan = SIZES[size]
    workdir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    servers = Servers()
    load_before = os.getloadavg()[0]
    try:
        sides = servers.sides()
        dispatch = {f"{name}/{k}": measure(servers, sides[name], plan.queues, k, plan.tasks,
                                           workdir)
                    for name in ("single", "cluster") for k in plan.dispatchers}
        dispatch["single_direct/1"] = measure(servers, sides["single_direct"], plan.queues,
                                              1, plan.tasks, workdir)
        drain = {name: measure(servers, sides[name], plan.queues, max(plan.dispatchers),
                               plan.drain_tasks, workdir, workers=2)
                 for name in ("single", "cluster")}
        growth = [measure(servers, sides[name], q, k, plan.tasks, workdir)
                  for q in plan.growth for name, k in (("single", 1),
                                                       ("cluster", max(plan.dispatchers)))]
    finally:
        servers.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    best = {name: max(v["per_s"] for k, v in dispatch.items() if k.startswith(name + "/"))
            for name in ("single", "cluster")}
    row = {"scenario": "scale", "size": size, "dispatch": dispatch,
           "dispatch_ratio": round(best["cluster"] / best["single"], 3),
           "drain": drain,
           "drain_ratio": round(drain["cluster"]["per_s"] / drain["single"]["per_s"], 3),
           "growth": growth, "commit": commit(), "at": time.time(),
           "load_before": load_before, "machine": machine()}
    results.mkdir(exist_ok=True)
    with open(results / "scale.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")
    return row


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench scale", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="6,000 tasks, queues 1/4/8")
    parser.add_argument("--smoke", action="store_true", help="tiny: only that it runs")
    args = parser.parse_args(argv)
    row = run("smoke" if args.smoke else "quick" if args.quick else "full")
    print(json.dumps({k: v for k, v in row.items() if k != "machine"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
