"""The plain records of one fair queue's state: a held message, a group, a dispatch, and
the common inspection every store answers (what the model test compares). Data only:
:mod:`.common` holds the state's operations, and the pure decisions import these types
without importing them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..store.base import Placement
from .decisions import CLASSES


@dataclass
class Held:
    """A held or delayed message."""

    value: bytes
    placement: Placement


@dataclass
class Group:
    """A group with held, delayed or in-flight work (an idle one is forgotten)."""

    inflight: int = 0
    delayed: int = 0
    parked: int = 0  # held messages parked (subcaps.py): not in its lists
    #: class -> virtual start tag; absent until first set (then read as 0)
    tags: dict[str, float] = field(default_factory=dict)
    #: harmony: the queue's pick sequence when it was last served (0: never), and the
    #: rank ``boost_task`` set until its next pick
    served: int = 0
    jump: float | None = None
    #: fair_charge 'runtime': the mean of the runtimes its releases reported (seconds;
    #: None: none yet), the estimate its next dispatches are charged
    runtime: float | None = None
    #: class -> when (ms) the head of its list became the head: set at every change of
    #: the head (a hold into an empty list or to the front, a pick, a cancel of the
    #: head, a promote or reclaim to the head, a boost to the front); stale while the
    #: list is empty (the next message in stamps it again)
    since: dict[str, int] = field(default_factory=dict)
    #: fair_scope 'app' under wfq (scope.py): class -> the app's charge total of the
    #: group when this queue last took it into the group's tag
    seen: dict[str, float] = field(default_factory=dict)


@dataclass
class Record:
    """A dispatch: a message taken by ``pick`` until it is released."""

    state: str
    placement: Placement  # of the message it carries
    hold_id: str
    #: the stored value, kept until a worker begins it (and while an acks_late run runs)
    value: bytes | None
    kept: bool = False  # an acks_late run keeps the value with the record
    runner: str = ""  # the run that began it
    expires_ms: int | None = None  # when a superseded or lost record is forgotten
    #: what the pick charged its group as the estimate under ``fair_charge`` 'runtime'
    #: (None: another charge), corrected at release by the runtime the worker reports
    estimate: float | None = None
    singleton: str | None = None  # its singleton key: the dispatch owns it
    #: fair_affinity: the target it was routed to ('' for none), counted in ``wflight``
    target: str = ""
    #: caps per subgroup: the subgroup it counts against in ``sflight`` ('' none: picked
    #: without one, or not under fair_subgroup 'path')
    subgroup: str = ""

    @property
    def group(self) -> str:
        return self.placement.group

    @property
    def klass(self) -> str:
        return self.placement.klass


@dataclass(frozen=True)
class QueueState:
    """What a fair queue's scheduling looks like now: the common inspection of every
    store (what the model test compares). Only groups with something are listed."""

    ready: dict[str, dict[str, float]]  # class -> {group: tag}
    vt: dict[str, float]  # class -> virtual time (absent: never set)
    tags: dict[tuple[str, str], float]  # (class, group) -> tag
    inflight: dict[str, int]  # group -> dispatches in flight
    delayed: dict[str, int]  # group -> delayed messages
    held: dict[tuple[str, str], list[str]]  # (class, group) -> hold ids, head first
    total_inflight: int
    #: (class, group) -> when its head became the head (ms), for the non-empty lists
    since: dict[tuple[str, str], int] = field(default_factory=dict)
    #: soft caps: class -> {group: tag} of the groups at or over their cap with work
    over: dict[str, dict[str, float]] = field(default_factory=lambda: {c: {} for c in CLASSES})
    #: interactive dispatches in flight (``fair_interactive_share``)
    inflight_interactive: int = 0
