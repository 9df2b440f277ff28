"""The failover campaign: ``python -m bench chaos --store sentinel``.

The chaos campaign (bench/chaos.py, everything it kills and restarts) with celery-fair's
store on Redis behind Sentinel: a master, 2 replicas and 3 sentinels
(``celery_fair.testing.SentinelTopology``) the campaign starts on free ports; the broker
stays the campaign's own Redis (or RabbitMQ). ``--failovers`` times during the run it
SIGKILLs the master, waits until the sentinels promoted a replica that accepts writes, and
starts the old master again as a replica of the new one (``restart_as_replica``:
``--replicaof``, so it never serves its stale data as a master). The dispatcher and the
workers are not restarted for it: they find the new master through the sentinels.

``--store-replicas N`` (default 1) is ``fair_store_replicas``: hold, pick, release and cancel
wait for N replicas. The publisher runs beside the drain, so failovers strike while it
publishes; a publication that fails with ``HoldNotReplicated`` (held on the master, not
acknowledged by a replica in time) or any ``StoreError`` (no master for a moment) is sent
again with the same task id and counted (``publish_retries``). A resend of a hold that was
kept is held once, even after the first was dispatched or ran (hold.lua's ``sent`` key).

With ``--store-replicas 0`` a failover may lose the holds, picks and releases of its last
moments: the campaign measures that. A task lost there is ``lost_causes["failover"]`` (its
publication was acknowledged within ``LOSS_WINDOW`` seconds before a master was killed);
the run is marked ``losses_expected`` and ``ok`` then asks that no loss is anything else
(``unexplained``), with every other invariant as strict as ever. With N >= 1 any loss
fails the run.

The store-outage relay (``--store-outages``) is not used: the sentinels hand out the
master's own address, which no single relay can stand in front of.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from celery_fair.errors import HoldOutcomeUnknown, StoreError
from celery_fair.task import store_for
from celery_fair.testing import SentinelTopology

from . import chaos_proj
from .chaos import Campaign, Figures, Plan, _share, run

logger = logging.getLogger("bench.chaos")

#: A hold acknowledged this long before its master was killed may not have reached a
#: replica yet (replication is asynchronous; on 2 busy cores it lags by up to a second or
#: so): without fair_store_replicas its loss is the failover's doing.
LOSS_WINDOW = 3.0
#: Publications per burst and the pause between bursts: the publisher runs beside the
#: drain (about 75 tasks/s on 2 cores), so failovers strike while it publishes.
BURST, BURST_PAUSE = 25, 0.25
#: Sentinels' down-after-milliseconds: long enough that a master slowed down by a busy
#: machine (2 shared cores) is not taken for dead, short enough for quick failovers. A
#: failover the sentinels make on their own is still counted (``failovers_unplanned``).
DOWN_AFTER_MS = 3000
#: How long one publication is retried through a failover before the campaign gives up.
PUBLISH_DEADLINE = 120.0


@dataclass
class FailoverFigures(Figures):
    """The chaos figures, and what the failovers did."""

    store_replicas: int = 1
    failover_seconds: list[float] = field(default_factory=list)  # kill -> writable master
    # failovers the sentinels made on their own (a master they took for down): a
    # split brain, whose old master's last writes are lost even when a replica acked them
    failovers_unplanned: int = 0
    publish_retries: dict[str, int] = field(default_factory=dict)  # by error
    lost_causes: dict[str, int] = field(default_factory=dict)  # failover / unexplained
    losses_expected: bool = False  # store_replicas 0: unreplicated, losses expected

    @property
    def ok(self) -> bool:
        if self.losses_expected:  # measured, not required: see the module's docstring
            return not (self.lost_causes.get("unexplained") or self.invariants_broken)
        return not (self.tasks_lost or self.invariants_broken)

    @property
    def invariants_broken(self) -> bool:
        """The chaos campaign's, and with fair_store_replicas a task run again by a
        failover: what a caller was told is on a replica and a publication sent again is
        held once, so only a pick or begin lost in the replication lag (well under a
        millisecond here) could explain one; each is looked at, not passed (a worker's or
        the broker's redelivery keeps its own cause)."""
        return super().invariants_broken or bool(
            self.store_replicas and self.duplicate_causes.get("store_failover"))


class FailoverCampaign(Campaign):
    """The chaos campaign on a Sentinel store whose master is killed and replaced."""

    figures: FailoverFigures
    # A dispatcher restarted while no master is promoted yet waits for one, as a
    # service manager's restart would be told to.
    dispatch_options = ("--wait-for-store", "60")

    def __init__(self, plan: Plan) -> None:
        if plan.store_replicas < 0:
            raise ValueError(f"--store-replicas {plan.store_replicas}: expected 0 or more "
                             "replicas for each hold, release and cancel to wait for")
        if plan.store_outages:  # see the module's docstring
            logger.warning("chaos: no store outages with --store %s", plan.store)
            plan = replace(plan, store_outages=0)
        self.topology: SentinelTopology | None = None
        self.acked: dict[str, float] = {}  # task id -> when its publication returned
        self.retries: Counter[str] = Counter()
        self.failovers: list[tuple[float, float]] = []  # (killed, writable again)
        self._publisher: threading.Thread | None = None
        self._publish_error: BaseException | None = None
        super().__init__(plan)
        base = self.figures
        self.figures = FailoverFigures(
            groups=base.groups, broker=base.broker, store=base.store,
            redis_fsync=base.redis_fsync, store_replicas=plan.store_replicas,
            losses_expected=plan.store_replicas == 0)

    def _open_store(self) -> tuple[str, int | None]:
        self.topology = SentinelTopology(down_after_ms=DOWN_AFTER_MS)
        return self.topology.store_url, None  # no relay: see the module's docstring

    def _conf(self) -> dict[str, Any]:
        assert self.topology is not None
        return {**super()._conf(),
                "fair_store_transport_options": {"master_name": self.topology.master_name},
                "fair_store_replicas": self.plan.store_replicas}

    def _store_events(self, number: int) -> list[str]:
        return ["failover"] * _share(self.plan.failovers, self.plan.rounds, number)

    # -- publishing beside the drain ------------------------------------------------------

    def _submit(self, count: int) -> None:
        # Drawn here (the round's thread), so a seed gives the same tasks.
        weights = [40 if i < 3 else 1 for i in range(len(self.group_names))]
        tasks = [(group, str(uuid.uuid4()),
                  round(self.rng.uniform(0, self.plan.max_task_seconds), 4))
                 for group in self.rng.choices(self.group_names, weights, k=count)]
        self._publisher = threading.Thread(target=self._publish, args=(tasks,),
                                           daemon=True)
        self._publisher.start()

    def _publish(self, tasks: list[tuple[str, str, float]]) -> None:
        try:
            for i, task in enumerate(tasks):
                self._publish_one(*task)
                if i % BURST == BURST - 1:
                    time.sleep(BURST_PAUSE)
        except BaseException as exc:  # noqa: BLE001 - reported by the round's thread
            self._publish_error = exc

    def _publish_one(self, group: str, task_id: str, duration: float) -> None:
        """Publish until the store takes it; the same task id each time (a hold that was
        kept after all is held once, or as a copy that is skipped)."""
        work = self.app.tasks[chaos_proj.TASK]
        deadline = time.monotonic() + PUBLISH_DEADLINE
        while True:
            try:
                work.apply_async((group, task_id, duration), task_id=task_id)
                break
            except StoreError as exc:  # HoldNotReplicated, no master for a moment, ...
                self.retries[type(exc).__name__] += 1
                if isinstance(exc, HoldOutcomeUnknown):
                    self.retries["resent_outcome_unknown"] += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.acked[task_id] = time.time()
        with self._lock:
            self.task_ids.append(task_id)
            self.figures.tasks = len(self.task_ids)

    # -- failovers ---------------------------------------------------------------------------

    def _break(self, what: str) -> None:
        if what != "failover":
            super()._break(what)
            return
        assert self.topology is not None
        logger.info("chaos: failover")
        killed = time.time()
        self.events.append((killed, "failover", 0))
        old = self.topology.kill_master()
        new = self.topology.wait_for_failover(old, timeout=60)
        promoted = time.time()
        self.failovers.append((killed, promoted))
        self.topology.restart_as_replica(old, new, timeout=60)
        self.events.append((time.time(), "failover", 0))
        self.figures.kills["failover"] += 1
        logger.info("chaos: failover took %.1fs; old master back as a replica",
                    promoted - killed)

    # -- settling and the verdict ------------------------------------------------------------

    def _settle(self, number: int) -> None:
        """Once everything is published: until every task completed and no slot is in
        flight, or (a failover lost some) until the store holds nothing, no slot is in
        flight and nothing completed for longer than a lease and a redelivery."""
        if self._publisher is not None:
            self._publisher.join()
        if self._publish_error is not None:
            raise RuntimeError("the publisher gave up") from self._publish_error
        quiet_for = self.plan.lease_seconds + self.plan.visibility_timeout + 5
        deadline = time.monotonic() + self.plan.round_timeout
        want, seen, since = len(self.task_ids), -1, time.monotonic()
        while time.monotonic() < deadline:
            if self._crashed_workers():
                continue
            done, idle = self.ledger.completed(), self._store_idle()
            if done >= want and self._inflight() == 0:
                logger.info("round %d settled: %d tasks", number, want)
                return
            if done != seen or not idle:
                seen, since = done, time.monotonic()
            elif time.monotonic() - since > quiet_for:
                logger.warning("round %d settled with %d of %d tasks: the rest are gone",
                               number, done, want)
                return
            time.sleep(0.25)
        logger.error("round %d did not settle in %ss", number, self.plan.round_timeout)

    def _store_idle(self) -> bool:
        try:
            figures = store_for(self.app).queue_figures(self.queue)
        except StoreError:
            return False
        return not (figures.inflight or figures.held_interactive
                    or figures.held_background or figures.delayed)

    def _measure(self) -> None:
        super()._measure()
        f = self.figures
        f.publish_retries = dict(self.retries)
        f.failover_seconds = [round(up - down, 1) for down, up in self.failovers]
        done = {task for task, _, _, _, ended in self.ledger.runs() if ended is not None}
        unplanned = self._unplanned_failovers()
        f.failovers_unplanned = len(unplanned)
        causes: Counter[str] = Counter()
        for task in self.task_ids:
            if task not in done:  # acknowledged shortly before a master died?
                acked = self.acked.get(task, 0.0)
                if any(down - LOSS_WINDOW <= acked <= up for down, up in self.failovers):
                    causes["failover"] += 1
                elif any(at - LOSS_WINDOW - DOWN_AFTER_MS / 1000 <= acked <= at + 10
                         for at in unplanned):
                    causes["unplanned_failover"] += 1
                else:
                    causes["unexplained"] += 1
        f.lost_causes = dict(causes)

    def _unplanned_failovers(self) -> list[float]:
        """When the sentinels switched masters without the campaign killing one."""
        assert self.topology is not None
        return [at for at in self.topology.switches()
                if not any(down <= at <= up + 5 for down, up in self.failovers)]

    def _whereabouts(self, task_id: str) -> dict[str, Any]:
        return self._located(task_id)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.topology is not None:  # its servers' and sentinels' logs first
                shutil.copytree(self.topology.dir, self.workdir / "sentinel",
                                dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.rdb"))
                self.topology.stop()


def run_failovers(plan: Plan) -> Figures:
    """Run the failover campaign and print its JSON line (bench/chaos.py's ``run``)."""
    return run(plan, FailoverCampaign)
