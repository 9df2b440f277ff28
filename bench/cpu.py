"""``python -m bench cpu``: the CPU time every process spends per task, plain Celery and
celery-fair side by side in one run (issue 17's first figure: it holds across machines
better than throughput).

Each side runs as in production, every part a process of its own: the publisher
(``python -m bench.cpu_proj``, ``delay()`` in a loop over 10 groups), one worker (threads
pool, ``-c 8``, prefetch 1), for celery-fair the dispatcher (``celery fair dispatch``), and
the redis-server that is broker and store. Tasks are no-ops that count themselves on a
second redis-server, outside the measure. The CPU of the publisher is its rusage; of the
worker, the dispatcher and Redis, /proc/<pid>/stat from the publisher's start to the last
task's end, every part started and warmed up before. ``--published-first``: nothing is
consumed until everything is published: plain Celery's worker has its consumer cancelled
until then; celery-fair's dispatcher is stopped until then and started again, its
start-up CPU (measured on an idle queue before) taken off. ``--no-hiredis`` runs every
process with redis-py's pure-Python parser. ``--quick-start`` adds a side with
``fair_quick_start`` on (``fair+quick``). ``--baseline REV`` adds a side: celery-fair as
of commit REV (``git archive``), the same app and processes, for a before/after in one
run. ``CPU_CONF`` (settings as JSON) applies to every celery-fair side. ``--broker
amqp``: the broker is the running RabbitMQ (a virtual host of the run's own), the
redis-server celery-fair's store alone; RabbitMQ's CPU (its ``beam.smp``, which serves
nothing else meanwhile) is the part ``rabbitmq``, in the total.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis

from celery_fair.testing import RedisServer

from . import harness
from .harness import commit, machine

ROOT = Path(__file__).resolve().parent.parent
CELERY = str(Path(sys.executable).with_name("celery"))
_TICK = os.sysconf("SC_CLK_TCK")
PARTS = ("app", "redis", "worker", "dispatcher")
#: A part of its own only with ``--broker amqp``.
BROKER_PART = "rabbitmq"


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class Side:
    """One side (plain, fair, or fair at a baseline commit) of one measure: its processes
    and its figures. ``root``: where ``celery_fair`` is imported from."""

    def __init__(self, name: str, server: RedisServer, counter: RedisServer,
                 env: dict[str, str], workdir: Path, root: Path = ROOT,
                 amqp: str | None = None) -> None:
        self.fair, self.server, self.workdir = name != "plain", server, workdir
        ns = name.replace("@", "").replace("+", "") + uuid.uuid4().hex[:6]
        path = os.pathsep.join([str(workdir / "app"), str(root), env.get("PYTHONPATH", "")])
        self.env = {**env, "PYTHONPATH": path, "CPU_BROKER": amqp or server.url + "/0",
                    "CPU_NS": ns, "CPU_QUEUE": ns, "CPU_COUNTER": counter.url + "/0"}
        if amqp:
            self.env["CPU_STORE"] = server.url + "/0"
        self.broker_pid = _beam_pid() if amqp else None
        self.counter = redis.Redis.from_url(counter.url + "/0")
        self.key = ns + ":done"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def _start(self, name: str, args: list[str], **env: str) -> None:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        self.procs[name] = subprocess.Popen(args, cwd=ROOT, env={**self.env, **env},
                                            stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def start_consumers(self, hold_back: bool) -> None:
        """The worker (and the dispatcher), warmed up; with ``hold_back`` nothing
        published next is consumed until :meth:`release`."""
        queue = self.env["CPU_QUEUE"]
        self._start("worker", [CELERY, "-A", "bench_cpu_proj", "worker", "-P", "threads",
                               "-c", "8", "--prefetch-multiplier", "1", "-n",
                               f"{queue}@bench", "-Q", queue, "-l", "WARNING",
                               "--without-heartbeat", "--without-gossip", "--without-mingle"])
        if self.fair:
            self._start("dispatcher", [CELERY, "-A", "bench_cpu_proj", "fair", "dispatch"])
        self.publish(8, 8)  # through every part: start-up costs are behind the measure
        self.wait_done(8, 120)
        self.counter.delete(self.key)
        if hold_back and self.fair:
            self._stop("dispatcher")
            self.startup = self._dispatcher_startup()
        elif hold_back:
            self._app().control.cancel_consumer(queue, destination=[f"{queue}@bench"],
                                                reply=True)

    #: CPU seconds a dispatcher spends starting (``start_consumers`` with ``hold_back``)
    startup = 0.0

    def _dispatcher_startup(self, settle: float = 3.0) -> float:
        """The CPU of a dispatcher's start and first steps, in an empty namespace."""
        self._start("dispatcher", [CELERY, "-A", "bench_cpu_proj", "fair", "dispatch"],
                    CPU_NS="idle" + self.env["CPU_NS"])
        time.sleep(settle)  # a bench, not a test: long enough to be done starting
        used = cpu_seconds(self.procs["dispatcher"].pid)
        self._stop("dispatcher")
        return used

    def release(self) -> None:
        """Let what was published be consumed (``start_consumers(hold_back)``)."""
        queue = self.env["CPU_QUEUE"]
        if self.fair:
            self._start("dispatcher", [CELERY, "-A", "bench_cpu_proj", "fair", "dispatch"])
        else:
            self._app().control.add_consumer(queue, destination=[f"{queue}@bench"],
                                             reply=True)

    def _stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.terminate()
        proc.wait(30)

    def _app(self) -> Any:
        from celery import Celery

        return Celery(broker=self.env["CPU_BROKER"], set_as_current=False)

    def publish(self, n: int, groups: int) -> tuple[float, float]:
        """Run the publisher to its end; its CPU seconds, and its publish loop's wall
        seconds (what it printed: its start-up is left out)."""
        proc = subprocess.Popen([sys.executable, "-m", "bench_cpu_proj", str(n), str(groups),
                                 "fair" if self.fair else "plain"], cwd=ROOT, env=self.env,
                                stdout=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        assert proc.stdout is not None
        printed = proc.stdout.read().decode().split()
        proc.stdout.close()
        if proc.returncode:
            raise RuntimeError(f"the publisher exited with {proc.returncode}")
        return usage.ru_utime + usage.ru_stime, float(printed[-1])

    def done(self) -> int:
        return int(self.counter.get(self.key) or 0)

    def wait_done(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.done() < n:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"the {name} exited ({proc.returncode}); see "
                                       f"{self.workdir / (name + '.log')}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.done()} of {n} tasks ran in {timeout:.0f}s")
            time.sleep(0.01)

    def cpu(self) -> dict[str, float]:
        pids = {name: p.pid for name, p in self.procs.items()}
        pids["redis"] = self.server.proc.pid
        if self.broker_pid:
            pids[BROKER_PART] = self.broker_pid
        return {name: cpu_seconds(pid) for name, pid in pids.items()}

    def stop(self) -> None:
        stop_all(self.procs.values())


def _beam_pid() -> int:
    """The running RabbitMQ's Erlang VM (the oldest ``beam.smp``)."""
    found = subprocess.run(["pgrep", "-o", "-x", "beam.smp"], capture_output=True, text=True)
    if found.returncode != 0:
        raise RuntimeError("bench cpu --broker amqp: no RabbitMQ (beam.smp) running")
    return int(found.stdout.split()[0])


def stop_all(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process, then wait for each (SIGKILL after 30 s)."""
    procs = list(procs)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def measure(name: str, n: int, groups: int, published_first: bool, env: dict[str, str],
            workdir: Path, root: Path = ROOT, amqp: bool = False) -> dict[str, Any]:
    """µs of CPU per task of each process, and the drain's rate, for one side."""
    from .sqlstores import RabbitVhost

    server, counter = RedisServer(), RedisServer()
    vhost = RabbitVhost("fair-bench-cpu-") if amqp else None
    side = Side(name, server, counter, env, workdir, root, vhost.url if vhost else None)
    try:
        side.start_consumers(hold_back=published_first)
        before, started = side.cpu(), time.monotonic()
        app_cpu, publishing = side.publish(n, groups)
        if published_first:  # the rate is the drain's alone
            started = time.monotonic()
            side.release()
            before["dispatcher"] = side.startup  # a new process: only its start to take off
        side.wait_done(n, 600)
        seconds = time.monotonic() - started
        after = side.cpu()
    finally:
        side.stop()
        server.stop()
        counter.stop()
        if vhost:
            vhost.delete()
    used = {name: after[name] - before.get(name, 0.0) for name in after}
    used["app"] = app_cpu
    parts = (*PARTS, BROKER_PART) if amqp else PARTS
    per_task = {name: round(used.get(name, 0.0) / n * 1e6) for name in parts}
    per_task["total"] = sum(per_task[p] for p in parts)
    return {"tasks_per_s": round(n / seconds, 1), "us_cpu_per_task": per_task,
            "published_per_s": round(n / publishing, 1)}


def run(tasks: int, groups: int, published_first: bool, hiredis: bool,
        results: Path | None = None, baseline: str | None = None,
        quick_start: bool = False, broker: str = "redis") -> dict[str, Any]:
    """Every side, one after the other; the row is appended to ``results``/cpu.jsonl
    (by default bench/results, looked up at the call)."""
    results = results or harness.RESULTS
    import json
    import shutil

    workdir = Path(tempfile.mkdtemp(prefix="bench-cpu-"))
    (workdir / "app").mkdir()
    shutil.copy(Path(__file__).with_name("cpu_proj.py"), workdir / "app" / "bench_cpu_proj.py")
    env = {**os.environ, "PYTHONPATH": ""}
    if not hiredis:  # a module named hiredis that fails to import: redis-py goes without
        (workdir / "app" / "hiredis.py").write_text("raise ImportError('bench cpu')\n")
    roots = {"plain": ROOT, "fair": ROOT}
    envs = {name: env for name in roots}
    if quick_start:
        roots["fair+quick"] = ROOT
        conf = {**json.loads(env.get("CPU_CONF") or "{}"), "fair_quick_start": True}
        envs["fair+quick"] = {**env, "CPU_CONF": json.dumps(conf)}
    if baseline:
        roots[f"fair@{baseline}"] = _checkout(baseline, workdir)
    sides = {name: measure(name, tasks, groups, published_first, envs.get(name, env),
                           workdir, root, amqp=broker == "amqp")
             for name, root in roots.items()}
    plain = sides["plain"]["us_cpu_per_task"]["total"]
    row = {"scenario": "cpu", "tasks": tasks, "groups": groups, "broker": broker,
           "published_first": published_first, "hiredis": hiredis, **sides,
           "added_us_per_task": {n: s["us_cpu_per_task"]["total"] - plain
                                 for n, s in sides.items() if n != "plain"},
           "drain_ratio": {n: round(s["tasks_per_s"] / sides["plain"]["tasks_per_s"], 3)
                           for n, s in sides.items() if n != "plain"},
           # the publisher's delay() loop: holds/s against plain delay()/s (issue 17)
           "hold_ratio": {n: round(s["published_per_s"] / sides["plain"]["published_per_s"],
                                   3) for n, s in sides.items() if n != "plain"},
           "commit": commit(), "at": time.time(), "load_before": os.getloadavg()[0],
           "machine": machine()}
    results.mkdir(exist_ok=True)
    with open(results / "cpu.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")
    return row


def _checkout(rev: str, workdir: Path) -> Path:
    """celery-fair's tree at ``rev`` (``git archive``), to import its ``celery_fair``."""
    target = workdir / f"base-{rev}"
    target.mkdir()
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cpu", description=__doc__)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--published-first", action="store_true",
                        help="publish everything, then start the worker (and dispatcher)")
    parser.add_argument("--no-hiredis", action="store_true",
                        help="every process without hiredis (redis-py's Python parser)")
    parser.add_argument("--baseline", metavar="REV", default=None,
                        help="also measure celery-fair as of this commit (e.g. 7a3fe78)")
    parser.add_argument("--quick-start", action="store_true",
                        help="also measure celery-fair with fair_quick_start on")
    parser.add_argument("--broker", choices=("redis", "amqp"), default="redis",
                        help="amqp: the running RabbitMQ is the broker (a vhost of its own)")
    args = parser.parse_args(argv)
    _print(run(args.tasks, args.groups, args.published_first, not args.no_hiredis,
               baseline=args.baseline, quick_start=args.quick_start, broker=args.broker))
    return 0


def _print(row: dict[str, Any]) -> None:
    sides = [k for k in row if k == "plain" or k.startswith("fair")]
    print(f"µs CPU per no-op task ({row['tasks']} tasks, {row['groups']} groups, "
          f"{'published first' if row['published_first'] else 'published while draining'}, "
          f"{'hiredis' if row['hiredis'] else 'no hiredis'}, "
          f"broker {row.get('broker', 'redis')})")
    parts = (*PARTS, BROKER_PART) if row.get("broker") == "amqp" else PARTS
    print(f"{'':16}" + "".join(f"{p:>11}" for p in (*parts, "total", "tasks/s", "publish/s",
                                                      "added", "ratio", "hold ratio")))
    for side in sides:
        cells = row[side]["us_cpu_per_task"]
        extra = "" if side == "plain" else \
            f"{row['added_us_per_task'][side]:>11,}{row['drain_ratio'][side]:>11}" \
            f"{row['hold_ratio'][side]:>11}"
        print(f"{side:16}" + "".join(f"{cells[p]:>11,}" for p in (*parts, "total"))
              + f"{row[side]['tasks_per_s']:>11,.0f}{row[side]['published_per_s']:>11,.0f}"
              + extra)
