"""The failover campaign on Redis Cluster: ``python -m bench chaos --store cluster``.

The Sentinel campaign (``bench/chaos_sentinel.py``: the publisher beside the drain, its
retries, the loss attribution, ``--store-replicas``), with celery-fair's store on a
3-primary, 3-replica Redis Cluster (``celery_fair.testing.ClusterTopology``) the campaign
starts on free ports; the broker stays the campaign's own Redis (or RabbitMQ).
``--failovers`` times during the run it SIGKILLs the primary that serves the campaign's
fair queue (all its keys share one hash slot), waits until the cluster promoted that
primary's replica and is ok again, and starts the killed node again on the same port and
directory: it reads its ``nodes.conf`` and rejoins as the new primary's replica
(:func:`restart_as_replica`). The dispatcher and the workers are not
restarted: redis-py's cluster client follows the slot to its new primary.

A cluster has no sentinels whose logs would tell of failovers nobody asked for; the
cluster's own node timeout (``NODE_TIMEOUT_MS``) is kept long enough that a busy machine
does not make one, and none is counted.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from celery_fair.testing import ClusterTopology, _until

from .chaos import Figures, Plan, run
from .chaos_sentinel import FailoverCampaign

logger = logging.getLogger("bench.chaos")

#: cluster-node-timeout: a primary unanswered this long is failed over (as the
#: sentinels' down-after in the Sentinel campaign: see DOWN_AFTER_MS there).
NODE_TIMEOUT_MS = 3000


class ClusterFailoverCampaign(FailoverCampaign):
    """The chaos campaign on a Redis Cluster store whose queue's primary is killed."""

    def _open_store(self) -> tuple[str, int | None]:
        self.cluster = ClusterTopology(node_timeout_ms=NODE_TIMEOUT_MS, timeout=60)
        return self.cluster.store_url, None  # no relay: the client finds each node

    def _conf(self) -> dict[str, Any]:
        # the campaign's own settings, without the Sentinel campaign's master name
        return {**super(FailoverCampaign, self)._conf(),
                "fair_store_replicas": self.plan.store_replicas}

    def _queue_primary(self) -> int:
        return self.cluster.primary_of(f"{self.namespace}:{{{self.queue}}}")

    def _break(self, what: str) -> None:
        if what != "failover":
            super()._break(what)
            return
        logger.info("chaos: cluster failover")
        killed = time.time()
        self.events.append((killed, "failover", 0))
        old = self._queue_primary()
        self.cluster.kill(old)
        self.cluster.wait_for_failover(old, timeout=60)
        promoted = time.time()
        self.failovers.append((killed, promoted))
        restart_as_replica(self.cluster, old, timeout=60)
        self.events.append((time.time(), "failover", 0))
        self.figures.kills["failover"] += 1
        logger.info("chaos: failover of the queue's primary took %.1fs; the old one is back "
                    "as a replica", promoted - killed)

    def _unplanned_failovers(self) -> list[float]:
        return []  # no sentinel logs to read them from: see the module's docstring

    def close(self) -> None:
        try:
            super().close()  # no Sentinel topology: its part does nothing
        finally:
            cluster = getattr(self, "cluster", None)
            if cluster is not None:
                cluster.stop()


def restart_as_replica(cluster: ClusterTopology, port: int, timeout: float = 30) -> None:
    """Start the (killed) node on ``port`` again, same port and directory: it reads its
    ``nodes.conf``, finds its slots served by the replica that took over, and rejoins as
    that one's replica. Returns once it is a replica in sync (a WAIT can count it) and
    every node says the cluster is ok."""
    next(s for s in cluster.servers if s.port == port).start()

    def in_sync() -> bool:
        try:
            info: Any = redis.Redis(port=port, socket_timeout=2).info("replication")
        except redis.RedisError:
            return False
        return bool(info.get("role") == "slave" and info.get("master_link_status") == "up")

    _until(lambda: in_sync() and all(cluster._ok(s.port, None) for s in cluster.servers),
           timeout, f"node {port} did not rejoin as a replica")


def run_cluster_failovers(plan: Plan) -> Figures:
    """Run the cluster failover campaign and print its JSON line."""
    return run(plan, ClusterFailoverCampaign)
