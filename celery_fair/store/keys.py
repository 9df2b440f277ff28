"""Names of the Redis keys of one fair queue. Mirrors ``lua/include/common.lua``."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The end of a dispatch id pick.lua makes: ``<call>.<n>``.
_DISPATCH_ID = re.compile(r"([0-9]+)\.([0-9]+)$")


@dataclass(frozen=True)
class QueueKeys:
    """Every key of the fair queue ``queue`` shares the hash tag ``{queue}``."""

    namespace: str
    queue: str

    @property
    def prefix(self) -> str:
        return f"{self.namespace}:{{{self.queue}}}"

    @property
    def msg(self) -> str:
        return f"{self.prefix}:msg"

    @property
    def stat(self) -> str:
        return f"{self.prefix}:stat"

    @property
    def vt(self) -> str:
        return f"{self.prefix}:vt"

    @property
    def conf(self) -> str:
        return f"{self.prefix}:conf"

    @property
    def caps(self) -> str:
        return f"{self.prefix}:caps"

    @property
    def weights(self) -> str:
        return f"{self.prefix}:weights"

    @property
    def rates(self) -> str:
        return f"{self.prefix}:rates"

    @property
    def conf_rates(self) -> str:
        return f"{self.prefix}:conf:rates"

    @property
    def limit_rates(self) -> str:
        return f"{self.prefix}:limit:rates"

    @property
    def throttled(self) -> str:
        return f"{self.prefix}:throttled"

    @property
    def tats(self) -> str:
        return f"{self.prefix}:tats"

    @property
    def groups(self) -> str:
        return f"{self.prefix}:groups"

    @property
    def delayed(self) -> str:
        return f"{self.prefix}:delayed"

    @property
    def leases(self) -> str:
        return f"{self.prefix}:leases"

    @property
    def wake(self) -> str:
        return f"{self.prefix}:wake"

    @property
    def refill(self) -> str:
        """The dispatcher's refill parameters (pick.lua writes them, release.lua reads)."""
        return f"{self.prefix}:refill"

    @property
    def refilled(self) -> str:
        return f"{self.prefix}:refilled"

    @property
    def handoff(self) -> str:
        return f"{self.prefix}:handoff"

    @property
    def quarantine(self) -> str:
        return f"{self.prefix}:quarantine"

    @property
    def quarantine_why(self) -> str:
        return f"{self.prefix}:quarantine:why"

    @property
    def quarantine_order(self) -> str:
        return f"{self.prefix}:quarantine:order"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    @property
    def wmeta(self) -> str:
        return f"{self.prefix}:wmeta"

    @property
    def aff(self) -> str:  # fair_affinity: group -> its worker (assign.lua)
        return f"{self.prefix}:aff"

    @property
    def wflight(self) -> str:  # fair_affinity: worker -> its routed dispatches in flight
        return f"{self.prefix}:wflight"

    @property
    def summary(self) -> str:
        return f"{self.prefix}:summary"

    @property
    def conf_caps(self) -> str:
        return f"{self.prefix}:conf:caps"

    @property
    def conf_weights(self) -> str:
        return f"{self.prefix}:conf:weights"

    @property
    def limit_caps(self) -> str:
        return f"{self.prefix}:limit:caps"

    @property
    def limit_weights(self) -> str:
        return f"{self.prefix}:limit:weights"

    @property
    def pauses(self) -> str:
        """ZSET paused group ('': the whole queue) -> until when (ms; inf: no end)."""
        return f"{self.prefix}:pauses"

    @property
    def boosts(self) -> str:
        """HASH boosted group -> boost weight (boost.lua)."""
        return f"{self.prefix}:boosts"

    @property
    def boosts_until(self) -> str:
        """ZSET boosted group -> until when (ms; inf: no end)."""
        return f"{self.prefix}:boosts:until"

    @property
    def backlog(self) -> str:
        return f"{self.prefix}:backlog"

    def held(self, klass: str, group: str) -> str:
        return f"{self.prefix}:q:{klass}:{group}"

    def held_keys(self, klass: str, group: str) -> str:
        """'smallest': ZSET hold id -> sort key of the held ids placed in key order."""
        return f"{self.prefix}:qk:{klass}:{group}"

    def subgroup_tags(self, klass: str, group: str) -> str:
        """fair_subgroup 'path': HASH subgroup -> the key of its last hold, and '\\n' ->
        the key last picked (the list's virtual time)."""
        return f"{self.prefix}:sg:{klass}:{group}"

    def parked(self, klass: str, group: str, subgroup: str) -> str:
        """Caps per subgroup: LIST the ids of the group's class list parked while the
        subgroup is at its cap, in order (``include/subcaps.lua``)."""
        return f"{self.prefix}:pk:{klass}:{group}/{subgroup}"

    @property
    def parked_lists(self) -> str:
        """Caps per subgroup: SET "<class>:<group>/<subgroup>" of the parked lists."""
        return f"{self.prefix}:parked"

    @property
    def subgroup_flight(self) -> str:
        """Caps per subgroup: HASH "<group>/<subgroup>" -> its dispatches in flight."""
        return f"{self.prefix}:sgflight"

    def group(self, group: str) -> str:
        return f"{self.prefix}:g:{group}"

    def ready(self, klass: str) -> str:
        return f"{self.prefix}:ready:{klass}"

    def over(self, klass: str) -> str:
        """Soft caps: the groups at or over their cap with work held (``common.lua``)."""
        return f"{self.prefix}:over:{klass}"

    def dispatch(self, dispatch_id: str) -> str:
        return f"{self.prefix}:d:{dispatch_id}"

    @property
    def singleton_keys(self) -> str:
        """HASH hold id -> singleton key of a message held with one."""
        return f"{self.prefix}:skey"

    @property
    def singleton_scope(self) -> str:
        """The prefix of singleton keys' owners and waiting lists: the namespace's (a
        key spans the app; on Redis Cluster ``include/singleton.lua`` uses the queue's
        prefix instead: a script reaches one slot)."""
        return f"{self.namespace}:singleton"

    @property
    def singleton_owners(self) -> str:
        """HASH singleton key -> its owner: 'h' (held) or 'd' (in flight) and
        '<queue>\\x1f<hold or dispatch id>' (``policy.singletons.ref``)."""
        return f"{self.singleton_scope}:sowner"

    def singleton_waiting(self, key: str) -> str:
        """LIST the refs waiting for singleton key ``key``, oldest first."""
        return f"{self.singleton_scope}:sw:{key}"

    @property
    def singleton_admit(self) -> str:
        """LIST this queue's hold ids that own their key, to enter at its promote."""
        return f"{self.singleton_scope}:sadmit:{self.queue}"

    def scope(self, what: str) -> str:
        """fair_scope 'app' (common.lua ``SC.key``): the namespace's ``n`` (HASH group ->
        in flight over the app-scoped queues), ``queues`` (SET of them), ``charge`` (HASH
        '<class>:<group>' -> wfq charge total), ``refresh:<queue>``."""
        return f"{self.namespace}:scope:{what}"

    def copies(self, hold_id: str) -> str:
        """The index of the copies of the task id ``hold_id`` (or of the copy) belongs
        to: its root, the part before a ``~``."""
        return f"{self.prefix}:copies:{hold_id.partition('~')[0]}"

    def cancelled(self, token: str) -> str:
        return f"{self.prefix}:cancelled:{token}"

    def done(self, dispatch_id: str) -> str:
        """The hash holding the tombstone of ``dispatch_id`` (``<token><call>.<n>``)."""
        match = _DISPATCH_ID.search(dispatch_id)
        if match is None:
            return f"{self.prefix}:done:-"
        return f"{self.prefix}:done:{int(match[1]) // 8}.{int(match[2]) // 16}"


def queues_key(namespace: str) -> str:
    """SET of the fair queues that have ever held a message."""
    return f"{namespace}:queues"


def dispatchers_key(namespace: str) -> str:
    """HASH of the dispatchers' heartbeats: id -> JSON of its beat and ``expires_ms``."""
    return f"{namespace}:dispatchers"


def audit_key(namespace: str) -> str:
    """LIST of the audit log's entries (JSON), newest first, trimmed to AUDIT_MAX."""
    return f"{namespace}:audit"
