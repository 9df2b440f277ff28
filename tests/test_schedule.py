"""Which queues a dispatcher steps next (celery_fair/schedule.py), on a clock moved by hand."""

from __future__ import annotations

from celery_fair.schedule import DUE_FLOOR_SECONDS, PRUNE_SECONDS, SWEEP_SECONDS, StepSchedule


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _stepped_all(schedule: StepSchedule, queues: list[str]) -> None:
    for queue in schedule.take(queues):
        schedule.stepped(queue, busy=False, more=False, next_due_in=None)


def test_new_queues_are_due_then_only_woken_or_swept_ones() -> None:
    clock, queues = Clock(), ["a", "b", "c"]
    schedule = StepSchedule(clock)
    schedule.track(queues)
    assert schedule.take(queues) == queues  # never stepped: due at once
    _stepped_all(schedule, queues)
    assert schedule.take(queues) == []
    assert schedule.timeout(queues, 5.0) == SWEEP_SECONDS
    schedule.woken({"b"})
    assert schedule.take(queues) == ["b"]
    assert schedule.take(queues) == []  # the wake-up is used up
    clock.now += SWEEP_SECONDS
    assert schedule.take(queues) == queues


def test_a_full_batch_a_due_message_and_a_capacity_change_make_a_queue_due() -> None:
    clock, queues = Clock(), ["a", "b", "c"]
    schedule = StepSchedule(clock)
    schedule.track(queues)
    schedule.take(queues)
    schedule.stepped("a", busy=True, more=True, next_due_in=None)
    schedule.stepped("b", busy=False, more=False, next_due_in=0.25)
    schedule.stepped("c", busy=False, more=False, next_due_in=None)
    assert schedule.take(queues) == ["a"]
    assert schedule.timeout(["b", "c"], 5.0) == 0.25
    clock.now += 0.25
    assert schedule.take(["b", "c"]) == ["b"]
    schedule.stepped("b", busy=False, more=False, next_due_in=-3.0)  # stuck in the past
    assert abs(schedule.timeout(["b"], 5.0) - DUE_FLOOR_SECONDS) < 1e-9
    schedule.due_now("c")
    assert schedule.take(["c"]) == ["c"]


def test_idle_means_nothing_happened_for_the_prune_horizon() -> None:
    clock, queues = Clock(), ["quiet", "busy", "woken"]
    schedule = StepSchedule(clock)
    schedule.track(queues)
    clock.now += PRUNE_SECONDS
    schedule.stepped("busy", busy=True, more=False, next_due_in=None)
    schedule.woken({"woken"})
    clock.now += 1
    assert schedule.idle() == ["quiet"]
    schedule.touch("quiet")
    assert schedule.idle() == []
    schedule.track(["busy"])  # the others left the working set
    clock.now += PRUNE_SECONDS + 1
    assert schedule.idle() == ["busy"]
