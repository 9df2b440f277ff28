"""The chaos campaign: nothing held is ever lost while everything around it dies.

``python -m bench chaos [--tasks N --groups G --rounds R ...]`` holds N fair tasks over G
capped groups, in R rounds, and drains them with real subprocess workers (prefork,
``acks_late``) and a subprocess dispatcher while it:

- SIGKILLs the dispatcher, from outside at random moments and from inside between pick and
  publish or between publish and confirm (the test-only hook in ``bench/chaos_proj.py``);
- SIGKILLs whole workers (main process and pool) and starts new ones;
- runs ``--namespaced-workers`` more workers in PID namespaces of their own (``unshare
  --pid``, as root): the same hostname as the others but none of their pids, as
  containers on the host network are; celery-fair must never take their live runs for
  dead ones (they are not killed: they stand for the other containers);
- cuts the store away from one worker (``--store-outages``: its store URL goes through a
  relay, ``bench/proxy.py``, that stops answering for up to ``--store-outage-seconds``)
  while its broker stays up: it keeps receiving, running and acking tasks, its releases
  wait and land afterwards;
- restarts Redis (broker and store; AOF, ``appendfsync everysec``) the way a service
  manager does (SIGTERM: Redis writes its AOF out before it exits) and crashes it (SIGKILL)
  and, with ``--broker amqp``, SIGKILLs and restarts a private RabbitMQ node;
- with ``--store postgresql``, keeps celery-fair's store in a private PostgreSQL server
  (``bench/postgres.py``; Redis is then the broker only) and crashes it ``--store-crashes``
  times: SIGKILL of the postmaster, restarted on the same port and data directory;
- with ``--store sentinel``, keeps the store behind Redis Sentinel and fails its master
  over ``--failovers`` times (the failover campaign: ``bench/chaos_sentinel.py``); with
  ``--store cluster`` the same on a Redis Cluster, killing the queue's primary
  (``bench/chaos_cluster.py``).

A Redis crash under ``appendfsync everysec`` may forget writes it had already acknowledged:
Redis replies before its AOF write while a background fsync is slow (up to 2 s of them).
No queue in front of Redis can keep what Redis forgets, so ``--redis-crashes`` runs with
``--redis-fsync always`` unless told otherwise, and a canary (a counter INCRed every few ms)
reports how many acknowledged writes each Redis crash or restart took with it.

What happened is read from the PostgreSQL ledger (``bench/ledger.py``), not from
celery-fair. After each round everything must settle: every task completed, no slot in
flight. The report is one JSON line: tasks, kills of each kind, tasks lost, duplicates
executed and skipped, leaked slots, cap violations, wall time.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery

from celery_fair.config import reset_config
from celery_fair.errors import FairError
from celery_fair.task import store_for
from celery_fair.testing import pool_processes

from . import chaos_proj
from .chaos_controls import ChaosControls
from .chaos_verdict import Canary, Measuring, run_check
from .ledger import Ledger
from .proxy import StoreProxy
from .services import CeleryProc, RedisNode

logger = logging.getLogger("bench.chaos")

#: How a namespaced worker is started: a PID namespace (and /proc) of its own, nothing else.
UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc")


def can_unshare() -> bool:
    """Whether this process may start processes in PID namespaces of their own."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30).returncode == 0


@dataclass
class Plan:
    """How big the campaign is and how much it breaks."""

    tasks: int = 10_000
    groups: int = 50
    rounds: int = 5
    workers: int = 2
    concurrency: int = 4
    dispatcher_kills: int = 20  # from outside; the crash hook adds its own
    hook_probability: float = 0.0005  # per message, at each of the hook's two points
    worker_kills: int = 6
    redis_restarts: int = 2  # SIGTERM: a restart by a service manager
    redis_crashes: int = 1  # SIGKILL
    # ``appendfsync``; '' picks 'always' when there are crashes, else 'everysec'.
    redis_fsync: str = ""
    rabbitmq_restarts: int = 0
    # Workers in PID namespaces of their own (same hostname; needs root and unshare).
    namespaced_workers: int = 1
    # Times the first namespaced worker's (else the first worker's) store stops answering
    # while its broker works, each for a random time up to store_outage_seconds (kept
    # below the lease, so its slots are not reclaimed meanwhile).
    store_outages: int = 1
    store_outage_seconds: float = 4.0
    broker: str = "redis"
    # Where celery-fair's store is: "redis" (the broker's Redis) or "postgresql" (a
    # private server the campaign starts, crashes store_crashes times and restarts).
    store: str = "redis"
    store_crashes: int = 2
    # --store sentinel (bench/chaos_sentinel.py): times the master is SIGKILLed, a
    # replica promoted and the old master restarted as a replica; fair_store_replicas
    # (0: unreplicated, losses measured rather than refused).
    failovers: int = 5
    store_replicas: int = 1
    # How long a dead worker's slots stay held: its acks_late runs are held again when
    # their leases run out (the broker's copies are skipped); short keeps rounds quick.
    # (Without kept bytes a redelivered copy would have to find its slot still held, so
    # the lease had to exceed the Redis redelivery delay: DESIGN.md, "Crashes".)
    lease_seconds: float = 12.0
    visibility_timeout: int = 6
    max_task_seconds: float = 0.03
    round_timeout: float = 240.0
    # Seconds between random operator controls (pauses with and without an end, resumes,
    # whole-queue pauses, boosts with and without an end) during each round
    # (bench/chaos_controls.py); 0: none.
    control_interval: float = 0.5
    # fair_affinity for the campaign ('hash': each group's tasks go to one worker's own
    # queue; the workers already have distinct hostnames, kills included).
    affinity: str = "none"
    # Singleton keys (issue 14 item 4): each task gets one of this many keys
    # (fair_singleton, at random), so at most one task per key may run at a time; the
    # verdict counts runs of one key that overlapped (0: no keys).
    singletons: int = 0
    seed: int | None = None


@dataclass
class Figures:
    """What the campaign did and found (the report's JSON line)."""

    tasks: int = 0
    groups: int = 0
    broker: str = "redis"
    store: str = "redis"
    affinity: str = "none"
    singletons: int = 0  # the keys the tasks were spread over (0: none)
    # Pairs of runs of one singleton key, of different tasks, that overlapped in time
    # (a run cut short by a kill has no end and is left out): must be 0.
    singleton_overlaps: int = 0
    singleton_examples: list[Any] = field(default_factory=list)  # up to 3 pairs
    kills: dict[str, int] = field(default_factory=Counter)
    namespaced_workers: int = 0  # how many workers ran in PID namespaces of their own
    namespaced_runs: int = 0  # runs they did (their pool's parent is pid 1 there)
    redis_fsync: str = ""
    redis_lost_writes: int = 0  # acknowledged canary writes Redis no longer had
    completed: int = 0
    tasks_lost: int = 0
    duplicates_executed: int = 0
    # Why each duplicate ran: Celery's acks_late redelivery of a message whose ack died
    # with its worker or its broker connection, or nothing the campaign did (a bug).
    duplicate_causes: dict[str, int] = field(default_factory=dict)
    duplicates_skipped: int = 0
    interrupted_runs: int = 0
    leaked_slots: int = 0
    ledger_running: int = 0  # runs with no end whose process did not die
    cap_violations: int = 0
    # Why: a redelivered duplicate ran beside the group's tasks (its dispatch already
    # released, so it took no slot), or nothing the campaign did (a bug).
    cap_violation_causes: dict[str, int] = field(default_factory=dict)
    runs_at_cap: int = 0  # runs that saw their group exactly at its cap: caps did bind
    controls: dict[str, int] = field(default_factory=dict)  # applied, by kind
    controls_left: int = 0  # pauses and boosts in force at the end (ends passed): 0
    controls_error: str | None = None  # a control failed other than by a store outage
    checks: list[Any] = field(default_factory=list)
    wall_seconds: float = 0.0
    lost_examples: dict[str, Any] = field(default_factory=dict)  # task id -> where it is
    skipped_examples: list[Any] = field(default_factory=list)  # (task, dispatch, pid, at)
    duplicate_examples: dict[str, Any] = field(default_factory=dict)  # up to 5, with their cause
    cap_examples: list[Any] = field(default_factory=list)  # unexplained: runs beside it
    logs: str = ""

    @property
    def check_problems(self) -> int:
        """Findings of the invariant checker over all rounds."""
        return sum(len(c.get("findings", ())) for c in self.checks if isinstance(c, dict))

    @property
    def ok(self) -> bool:
        return not (self.tasks_lost or self.invariants_broken)

    @property
    def invariants_broken(self) -> bool:
        """Anything but a lost task that fails the run."""
        return bool(self.duplicate_causes.get("unexplained")
                    or self.check_problems or self.leaked_slots
                    or self.cap_violation_causes.get("unexplained") or self.ledger_running
                    or self.singleton_overlaps
                    or self.controls_left or self.controls_error)


class Campaign(Measuring):
    """One chaos run: its Redis, its ledger, its workers and dispatcher (its verdict:
    :class:`~bench.chaos_verdict.Measuring`)."""

    figures: Figures
    #: More ``celery fair dispatch`` options for each dispatcher the campaign starts.
    dispatch_options: tuple[str, ...] = ()

    def __init__(self, plan: Plan, workdir: Path | None = None) -> None:
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="chaos-"))
        self.namespace = "c" + uuid.uuid4().hex[:8]
        self.queue = "q-" + self.namespace
        self.group_names = [f"g{i:02d}" for i in range(plan.groups)]
        self.caps = {g: 1 + i % 3 for i, g in enumerate(self.group_names)}
        fsync = plan.redis_fsync or ("always" if plan.redis_crashes else "everysec")
        self.figures = Figures(tasks=0, groups=plan.groups, broker=plan.broker,
                               store=plan.store, affinity=plan.affinity,
                               singletons=plan.singletons, redis_fsync=fsync)
        self.redis = RedisNode(fsync, log=self.workdir / "redis.log")
        self.canary = Canary(self.redis.url)
        self.rabbit: Any = None
        self.postgres: Any = None
        self.store_url, store_port = self._open_store()
        self.proxy = StoreProxy(store_port) if plan.store_outages and store_port else None
        self.ledger = Ledger.create(caps=self.caps)
        self.workers: list[CeleryProc] = []  # killed at random, replaced
        self.singleton_of: dict[str, str] = {}  # task id -> its singleton key
        self.namespaced: list[CeleryProc] = []  # never killed: the other containers
        self.dispatcher: CeleryProc | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seq = 0
        self.task_ids: list[str] = []
        self.events: list[tuple[float, str, int]] = []  # (time, what, worker pid)
        self.app = self._make_app()
        self.controls = ChaosControls(self.app, self.queue, self.group_names, self.rng,
                                      plan.control_interval)

    # -- set-up ------------------------------------------------------------------------

    def _open_store(self) -> tuple[str, int | None]:
        """celery-fair's store: its URL, and the port a store outage's relay forwards to
        (None: no relay). The broker's Redis, or a private PostgreSQL server."""
        self.postgres = _store_node(self.plan.store, self.workdir)
        if self.postgres is not None:
            return self.postgres.url, self.postgres.port
        return self.redis.url, self.redis.port

    def _conf(self) -> dict[str, Any]:
        return {
            **self._routing_conf(),
            "fair_default_concurrency": 2,
            "fair_group_concurrency": self.caps,
            "fair_lease_seconds": self.plan.lease_seconds,
            # Redis broker: a killed worker's unacked messages come back after the
            # visibility timeout; a worker killed while it held kombu's restore mutex
            # blocks every restore until the mutex expires (300 s by default).
            "broker_transport_options": {
                "visibility_timeout": self.plan.visibility_timeout,
                "unacked_restore_interval": 1, "unacked_restore_throttle": 1,
                "unacked_mutex_expire": 10},
        }

    def _routing_conf(self) -> dict[str, Any]:
        """fair_affinity (``--affinity hash``); singleton keys need no setting (each task
        names its key at the call: ``_submit``)."""
        conf: dict[str, Any] = {}
        if self.plan.singletons and self.plan.store == "postgresql":
            raise ValueError("--singletons needs a Redis store (--store redis, sentinel "
                             "or cluster): the SQL stores refuse singleton keys")
        if self.plan.affinity != "none":
            conf["fair_affinity"] = self.plan.affinity
        return conf

    def _broker_url(self) -> str:
        if self.plan.broker == "amqp":
            from .rabbit import RabbitNode

            if self.rabbit is None:
                self.rabbit = RabbitNode(self.workdir)
            return str(self.rabbit.url)
        return self.redis.url

    def _make_app(self) -> Celery:
        app = chaos_proj.create_app(self._broker_url(), self.store_url, self.namespace,
                                    self.queue, self.ledger, **self._conf())
        reset_config(app)
        return app

    def _env(self) -> dict[str, str]:
        return chaos_proj.environment(self._broker_url(), self.store_url, self.namespace,
                                      self.queue, self.ledger, self._conf())

    def _log(self, name: str) -> Path:
        self._seq += 1
        return self.workdir / f"{self._seq:03d}-{name}.log"

    def start_worker(self, namespaced: bool = False, proxied: bool = False) -> CeleryProc:
        """A worker; ``namespaced``: in a PID namespace of its own; ``proxied``: its store
        through the relay that store outages cut."""
        name = f"w{self._seq}-{self.namespace}@%h"
        env = self._env()
        if proxied and self.proxy is not None:
            env["CHAOS_STORE"] = _through(self.store_url, self.proxy)
        proc = CeleryProc(["worker", "-P", "prefork", "-c", str(self.plan.concurrency),
                           "--without-mingle", "--without-gossip", "--without-heartbeat",
                           "-l", "WARNING", "-n", name], env,
                          self._log("nsworker" if namespaced else "worker"),
                          wrap=UNSHARE if namespaced else ())
        (self.namespaced if namespaced else self.workers).append(proc)
        return proc

    def _start_workers(self) -> None:
        namespaced = self.plan.namespaced_workers if can_unshare() else 0
        if self.plan.namespaced_workers and not namespaced:
            logger.warning("chaos: no PID namespaces here (needs root and unshare): "
                           "every worker shares the campaign's")
        self.figures.namespaced_workers = namespaced
        for i in range(namespaced):
            self.start_worker(namespaced=True, proxied=i == 0)
        for i in range(self.plan.workers):
            self.start_worker(proxied=i == 0 and not namespaced)

    def start_dispatcher(self) -> CeleryProc:
        env = {**self._env(), "CHAOS_DISPATCH_KILL_P": str(self.plan.hook_probability)}
        self.dispatcher = CeleryProc(["fair", "dispatch", "-l", "WARNING",
                                      *self.dispatch_options], env,
                                     self._log("dispatcher"))
        return self.dispatcher

    # -- the run -------------------------------------------------------------------------

    def run(self) -> Figures:
        start = time.monotonic()
        watcher = threading.Thread(target=self._watch_dispatcher, daemon=True)
        try:
            self._start_workers()
            self.start_dispatcher()
            watcher.start()
            threading.Thread(target=self.canary.run, args=(self._stop,), daemon=True).start()
            for number in range(self.plan.rounds):
                self._round(number)
            self.figures.controls_left = self.controls.leftovers()
        finally:
            self._stop.set()
            self.controls.stop()
            self.figures.controls = dict(self.controls.applied)
            self.figures.controls_error = self.controls.error
            self.figures.wall_seconds = round(time.monotonic() - start, 1)
            self.figures.redis_lost_writes = self.canary.lost
            self._measure()
        return self.figures

    def _round(self, number: int) -> None:
        plan, rounds = self.plan, self.plan.rounds
        share = _share(plan.tasks, rounds, number)
        before = len(self.task_ids)
        self._submit(share)
        events = (["dispatcher"] * _share(plan.dispatcher_kills, rounds, number)
                  + ["worker"] * _share(plan.worker_kills, rounds, number)
                  + ["redis"] * _share(plan.redis_restarts, rounds, number)
                  + ["redis_crash"] * _share(plan.redis_crashes, rounds, number)
                  + ["rabbitmq"] * _share(plan.rabbitmq_restarts, rounds, number)
                  + self._store_events(number)
                  + ["store_outage"] * _share(plan.store_outages, rounds, number))
        self.rng.shuffle(events)
        # Each event strikes while the round's tasks drain, at a random point of it; the
        # operator's controls come and go all along.
        marks = sorted(self.rng.uniform(0.05, 0.9) for _ in events)
        self.controls.start()
        for event, mark in zip(events, marks):
            self._wait_progress(before + int(mark * share))
            time.sleep(self.rng.uniform(0.2, 1.0))  # not two blows at the same instant
            self._break(event)
        self._wait_progress(before + int(0.9 * share))  # controls until the round's end
        self.controls.stop()
        self.controls.lift()  # what has no end; what has one ends by itself
        self._settle(number)
        self.figures.checks.append(run_check(self.app))

    def _store_events(self, number: int) -> list[str]:
        """What happens to the store itself in round ``number``: PostgreSQL crashes."""
        count = _share(self.plan.store_crashes, self.plan.rounds, number)
        return ["store_crash"] * (count if self.postgres else 0)

    def _submit(self, count: int) -> None:
        work = self.app.tasks[chaos_proj.TASK]
        # A few heavy groups (most of the work: their caps bind all the time) and a long
        # tail of light ones.
        weights = [40 if i < 3 else 1 for i in range(len(self.group_names))]
        for group in self.rng.choices(self.group_names, weights, k=count):
            task_id = str(uuid.uuid4())
            duration = round(self.rng.uniform(0, self.plan.max_task_seconds), 4)
            options: dict[str, Any] = {}
            if self.plan.singletons:  # keys across the groups: one key, several groups
                key = f"k{self.rng.randrange(self.plan.singletons)}"
                options["fair_singleton"] = self.singleton_of[task_id] = key
            work.apply_async((group, task_id, duration), task_id=task_id, **options)
            self.task_ids.append(task_id)
        self.figures.tasks = len(self.task_ids)

    def _wait_progress(self, completed: int, timeout: float = 20.0) -> None:
        """Until ``completed`` tasks ran (or ``timeout``: a stall is no reason to stop)."""
        deadline = time.monotonic() + timeout
        while self.ledger.completed() < completed and time.monotonic() < deadline:
            self._crashed_workers()
            time.sleep(0.05)

    def _break(self, what: str) -> None:
        logger.info("chaos: %s", what)
        if what == "dispatcher":
            with self._lock:
                if self.dispatcher is not None and self.dispatcher.alive():
                    self.dispatcher.kill()
                    self.figures.kills["dispatcher_external"] += 1
                elif self.dispatcher is not None:  # died since the watcher last looked
                    self._dispatcher_gone(self.dispatcher)
                self.start_dispatcher()
        elif what == "worker":
            self._kill_worker()
        elif what == "store_outage" and self.proxy is not None:
            self.events.append((time.time(), "store_outage", 0))
            self.proxy.cut(self.rng.uniform(0.5, self.plan.store_outage_seconds))
            self.figures.kills["store_outage"] += 1
            self.events.append((time.time(), "store_outage", 0))
        elif what in ("redis", "redis_crash", "rabbitmq", "store_crash"):
            self.events.append((time.time(), "outage", 0))
            server = {"rabbitmq": self.rabbit, "store_crash": self.postgres}.get(
                what, self.redis)
            crash = what != "redis"
            server.restart(down=self.rng.uniform(0.2, 2.0), crash=crash)
            self.figures.kills[what if "crash" in what else f"{what}_restart"] += 1
            self.events.append((time.time(), "outage", 0))

    def _kill_worker(self) -> None:
        # A worker that exited by itself (kombu, on a Redis restart) is replaced first: all
        # of them may be down at once, and the kill is meant for a live one.
        self._crashed_workers()
        live = [w for w in self.workers if w.alive()]
        if not live:
            logger.warning("no live worker to kill this time")
            return
        victim = self.rng.choice(live)
        children = pool_processes(victim.pid)
        if children and self.rng.random() < 1 / 3:
            # One pool process only: the worker reports the task failed (WorkerLostError)
            # and, with task_reject_on_worker_lost, the broker redelivers it.
            child, at = self.rng.choice(children), time.time()
            os.kill(child, signal.SIGKILL)
            self.events.append((at, "worker", victim.pid))
            self.ledger.died(victim.pid, child, at)
            self.figures.kills["pool_process"] += 1
            return
        at = time.time()
        victim.kill()
        self.events.append((at, "worker", victim.pid))
        self.workers.remove(victim)
        self.ledger.died(victim.pid, None, at)  # its runs without an end stopped then
        self.figures.kills["worker"] += 1
        self.start_worker()

    def _watch_dispatcher(self) -> None:
        """Restart the dispatcher whenever the crash hook killed it."""
        while not self._stop.wait(0.1):
            with self._lock:
                proc = self.dispatcher
                if proc is not None and not proc.alive():
                    self._dispatcher_gone(proc)
                    self.start_dispatcher()

    def _dispatcher_gone(self, proc: CeleryProc) -> None:
        """Count a dispatcher found dead: the crash hook's SIGKILL, or a crash of its own
        (logged with its output)."""
        if proc.proc.returncode == -9:
            self.figures.kills["dispatcher_hook"] += 1
        else:  # not ours: a crash worth reading about
            logger.error("dispatcher exited by itself (%s):\n%s", proc.proc.returncode,
                         proc.tail())
            self.figures.kills["dispatcher_crashed_itself"] += 1

    def _settle(self, number: int) -> None:
        """Wait until every task so far completed and no slot is in flight."""
        deadline = time.monotonic() + self.plan.round_timeout
        want = len(self.task_ids)
        while time.monotonic() < deadline:
            if self._crashed_workers():
                continue
            if self.ledger.completed() >= want and self._inflight() == 0:
                logger.info("round %d settled: %d tasks", number, want)
                return
            time.sleep(0.25)
        logger.error("round %d did not settle in %ss", number, self.plan.round_timeout)

    def _crashed_workers(self) -> bool:
        """A worker that died on its own (not killed by us) is replaced and reported."""
        dead = [w for w in [*self.workers, *self.namespaced] if not w.alive()]
        for proc in dead:
            logger.error("worker exited by itself:\n%s", proc.tail())
            namespaced = proc in self.namespaced
            (self.namespaced if namespaced else self.workers).remove(proc)
            self.events.append((time.time(), "worker", proc.own_pid))
            self.ledger.died(proc.own_pid, None, time.time())
            self.figures.kills["worker_crashed_itself"] += 1
            self.start_worker(namespaced=namespaced)
        return bool(dead)

    def _inflight(self) -> int:
        """Slots in flight in the store: the queue's total, every group's and, with
        affinity, every worker's routed ones (all 0)."""
        try:
            snap = store_for(self.app).snapshot(self.queue)
            routed = store_for(self.app).worker_inflight(self.queue)  # affinity's
        except FairError:
            return -1
        return int(snap["inflight"]) + sum(g["inflight"] for g in snap["groups"]) \
            + sum(routed.values())

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            procs = [*self.workers, *self.namespaced,
                     *([self.dispatcher] if self.dispatcher else [])]
            self.dispatcher = None
        for proc in procs:
            proc.stop()
        if self.proxy is not None:
            self.proxy.close()
        if self.rabbit is not None:
            self.rabbit.stop()
        if self.postgres is not None:
            self.postgres.stop()
        self.redis.stop()
        self.ledger.drop()

    def keep_redis_data(self) -> None:
        """Copy Redis's AOF beside the logs: every write, to trace what went wrong."""
        shutil.copytree(self.redis.dir, self.workdir / "redis-data", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("redis.log"))

    def logs(self) -> str:
        procs = [*self.workers, *self.namespaced,
                 *([self.dispatcher] if self.dispatcher else [])]
        return "\n".join(p.tail() for p in procs)


def _store_node(store: str, workdir: Path) -> Any:
    """The private PostgreSQL of ``--store postgresql``; None for ``redis`` (the
    broker's Redis is the store)."""
    if store == "redis":
        return None
    if store != "postgresql":
        raise ValueError(f"--store {store!r} is not a store this campaign runs: expected "
                         "'redis' or 'postgresql' ('sentinel': bench/chaos_sentinel.py, "
                         "'cluster': bench/chaos_cluster.py)")
    from .postgres import PostgresNode

    return PostgresNode(log=workdir / "postgres.log")


def _through(url: str, proxy: StoreProxy) -> str:
    """``url`` with its host and port replaced by the relay's (a Redis or SQL URL)."""
    from sqlalchemy.engine import make_url

    if url.startswith("redis"):
        return proxy.url
    return make_url(url).set(host="127.0.0.1", port=proxy.port).render_as_string(
        hide_password=False)


def _share(total: int, parts: int, index: int) -> int:
    """Part ``index`` of ``total`` split as evenly as possible into ``parts``."""
    return total // parts + (1 if index < total % parts else 0)


def run(plan: Plan, campaign_class: type[Campaign] = Campaign) -> Figures:
    """Run the campaign and print its JSON line; raises nothing for broken invariants."""
    campaign = campaign_class(plan)
    try:
        figures = campaign.run()
        if not figures.ok:
            print(campaign.logs())
            campaign.keep_redis_data()
    finally:
        campaign.close()
    line = json.dumps({"scenario": "chaos", "ok": figures.ok, **asdict(figures)})
    (campaign.workdir / "report.json").write_text(line + "\n")  # beside the logs
    print(line, flush=True)
    return figures
