"""The fair-scheduling policy of one fair queue, as a pure state machine over plain data.

The Lua scripts (``store/lua``) are the Redis implementation; this module is the other
one, and the only one in Python: the memory store executes it under its lock, and a SQL
store is meant to execute it inside a transaction over the rows it locked. It does no
I/O and reads no clock: every time is passed in (milliseconds), and a wake-up is a flag
(:attr:`FairQueue.woken`) for the store to act on. ``tests/test_store_model.py`` holds
both implementations to the same decisions, step by step.

The policy (DESIGN.md, "Scheduling"): start-time fair queueing per class (a group's tag
advances by its charge / weight per dispatch: its cost, 1, or an estimate corrected by
the runtime its release reports, ``fair_charge``; a group entering a ready set starts at
max(its tag, the class's virtual time), one in it keeps its tag; the pick is the lowest
tag, ties by name),
interactive before background, a per-group cap with an interactive reserve above it
(cap 0 pauses a group in both classes), per-group rate limits (GCRA) and throttles, pauses
and boosts, a per-queue capacity, idle groups forgotten, and
dispatch leases that hold a message again at its group's head when they run out.
"""

from .common import KEEP, RESET, Placement, QueueData
from .decisions import CLASSES
from .operations import FairQueue
from .records import QueueState, Record

__all__ = ["CLASSES", "KEEP", "RESET", "FairQueue", "Placement", "QueueData", "QueueState",
           "Record"]
