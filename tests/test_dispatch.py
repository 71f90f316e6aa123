"""Dispatch, deadlines, re-queueing and the watchdog's rule, with fake instances (no processes)."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from packrat.serving.pool.api import InstanceConfig, Request
from packrat.serving.pool.supervisor import Watchdog
from packrat.serving.pool.dispatch import Dispatcher
from packrat.serving.pool.instance import StartFailed
from packrat.serving.pool.supervisor import Slot


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeInstance:
    def __init__(self, batch: int, capacity: int = 0, ready: bool = True):
        self.config = InstanceConfig(1, batch, (0,), capacity)
        self.ready, self.jobs, self.batches = ready, [], []
        self.warm_ms, self.hung, self.busy_since, self.waiting_turn = 0.0, False, 0.0, False

    @property
    def idle(self) -> bool:
        return self.ready and not self.jobs

    def submit(self, jobs) -> None:
        self.jobs = jobs
        self.batches.append(len(jobs))


def dispatcher(**kwargs) -> tuple[Dispatcher, Clock]:
    clock = Clock()
    return Dispatcher(clock=clock, **kwargs), clock


def queue(d: Dispatcher, n: int) -> list:
    return [d.enqueue(Request(bytes([i]))) for i in range(n)]


def test_shares_follow_the_plan_once_the_wave_is_in():
    d, _ = dispatcher()
    a, b = FakeInstance(4), FakeInstance(2)
    queue(d, 6)
    assert d.assign([a, b]) is None
    assert (a.batches, b.batches) == ([4], [2])
    assert [job.request.body for job in a.jobs] == [bytes([i]) for i in range(4)]  # in arrival order


def test_a_partial_wave_waits_for_the_gather_window_then_goes():
    d, clock = dispatcher(gather_ms=30)
    inst = FakeInstance(4)
    queue(d, 2)
    assert d.assign([inst]) == pytest.approx(0.030)
    assert inst.batches == []
    clock.now = 0.031
    assert d.assign([inst]) is None
    assert inst.batches == [2]


def test_nothing_waits_for_requests_that_are_not_coming():
    """One closed-loop user: its one request is all the pool will get until it is answered, so after
    the first hand-out showed that, it goes at once; once a wave brought more, a partial one waits."""
    d, clock = dispatcher(gather_ms=30)
    inst = FakeInstance(4)
    queue(d, 1)
    assert d.assign([inst]) == pytest.approx(0.030)  # nothing known yet: wait for the wave
    clock.now = 0.031
    d.assign([inst])
    for answered in range(3):
        inst.jobs = []
        queue(d, 1)
        assert d.assign([inst]) is None  # one request in the pool, as at every hand-out before
        assert inst.batches[-1] == 1
    inst.jobs = []
    queue(d, 4)  # more users arrived: a wave of 4 goes whole
    assert d.assign([inst]) is None and inst.batches[-1] == 4
    inst.jobs = []
    queue(d, 2)  # two of the next wave of four are in: wait for the rest
    assert d.assign([inst]) == pytest.approx(0.030)


def test_requests_running_elsewhere_count_towards_the_wave():
    d, clock = dispatcher(gather_ms=30)
    a, b = FakeInstance(2), FakeInstance(2)
    queue(d, 4)
    d.assign([a, b])  # a wave of 4
    a.jobs = []
    queue(d, 1)  # b still runs 2: 3 in the pool of the 4 a wave brings, so a waits for its second
    assert d.assign([a, b]) == pytest.approx(0.030)


def test_beyond_the_plan_instances_take_up_to_their_capacity():
    d, _ = dispatcher()
    a, b = FakeInstance(2, capacity=8), FakeInstance(2, capacity=8)
    queue(d, 10)
    d.assign([a, b])
    assert (a.batches, b.batches) == ([5], [5])


def test_busy_or_loading_instances_get_nothing():
    d, _ = dispatcher()
    busy, loading, free = FakeInstance(2), FakeInstance(2, ready=False), FakeInstance(2)
    busy.jobs = ["x"]
    queue(d, 2)
    d.assign([busy, loading, free])
    assert (busy.batches, loading.batches, free.batches) == ([], [], [2])


def test_a_lost_instances_requests_go_first_and_run_elsewhere():
    d, _ = dispatcher()
    dead, other = FakeInstance(2), FakeInstance(2)
    queue(d, 2)
    d.assign([dead])
    later = queue(d, 1)
    d.requeue(dead.jobs, "instance 0 died")
    d.assign([other])
    assert [job.request.body for job in other.jobs] == [b"\0", b"\1"]
    assert all(job.attempts == 1 for job in other.jobs) and d.counts.requeued == 2
    assert list(d.queue) == later


def test_a_request_that_keeps_losing_instances_is_answered_500():
    d, _ = dispatcher(max_attempts=3)
    (job,) = queue(d, 1)
    for attempt in range(3):
        d.queue.clear()
        d.requeue([job], "instance 0 hung: killed by the watchdog")
    answer = job.future.result(0)
    assert answer.status == 500 and "3 model instances were lost" in answer.reason and "watchdog" in answer.reason
    assert not d.queue


def test_requests_past_their_deadline_are_answered_504_queued_or_running():
    d, clock = dispatcher(request_timeout_s=10)
    running, waiting = queue(d, 2)
    inst = FakeInstance(1)
    d.assign([inst])
    clock.now = 5
    late = queue(d, 1)[0]
    assert d.expire(inst.jobs) == pytest.approx(5)  # the waiting one's deadline
    clock.now = 10
    assert d.expire(inst.jobs) == pytest.approx(5)  # only the newest is left queued
    for job in (running, waiting):
        answer = job.future.result(0)
        assert answer.status == 504 and "within 10 s" in answer.reason
    assert "running" in running.future.result(0).reason and "queued" in waiting.future.result(0).reason
    assert list(d.queue) == [late] and d.counts.expired == 2
    d.answered([running], [None])  # the instance's late answer is dropped
    assert running.future.result(0).status == 504 and d.counts.answered == 0


def test_a_full_queue_refuses_at_once():
    d, _ = dispatcher(max_queue=3)
    jobs = queue(d, 4)
    assert [job.future.done() for job in jobs] == [False, False, False, True]
    assert jobs[-1].future.result(0).status == 503 and "too many requests waiting" in jobs[-1].future.result(0).reason
    assert d.counts.refused == 1 and len(d.queue) == 3


@given(expected=st.floats(1, 10_000), warm=st.floats(0, 10_000), batch=st.integers(1, 64),
       requests=st.integers(1, 128))
def test_watchdog_allowance_is_generous_and_floored(expected, warm, batch, requests):
    dog = Watchdog(factor=10, floor_s=5)
    allowance = dog.allowance_s(InstanceConfig(1, batch, (0,), expected_ms=expected), warm, requests)
    assert allowance >= 5
    assert allowance >= 10 * max(expected, warm) / 1e3 * max(1, requests / batch) * (1 - 1e-9)
    assert Watchdog(batch_timeout_s=7).allowance_s(InstanceConfig(1, batch, (0,), expected_ms=expected), warm,
                                                   requests) == 7


def test_watchdog_names_only_instances_past_their_allowance():
    dog = Watchdog(factor=10, floor_s=1)
    slow, fine, idle = FakeInstance(1), FakeInstance(1), FakeInstance(1)
    slow.warm_ms = fine.warm_ms = 200  # allowance 2 s
    slow.jobs, fine.jobs = ["a"], ["b"]
    fine.busy_since = 1.0
    assert dog.overdue([slow, fine, idle], now=2.5) == [slow]
    slow.waiting_turn = True  # its batch waits for another model's turn: not running
    assert dog.overdue([slow, fine, idle], now=2.5) == []
    slow.waiting_turn, slow.hung = False, True  # already being killed
    assert dog.overdue([slow, fine, idle], now=2.5) == []


def test_watchdog_times_a_waiting_instance_that_holds_its_cores_from_when_it_was_seen_so():
    dog = Watchdog(factor=10, floor_s=1)
    stuck = FakeInstance(1)
    stuck.warm_ms, stuck.jobs, stuck.waiting_turn = 200, ["a"], True  # allowance 2 s, sent at 0
    asked = []

    def seen_holding_since(inst):
        asked.append(inst)
        return 2.1  # first seen holding its cores, without having said so, at 2.1 s

    assert dog.overdue([stuck], now=1.5, silent_hold_since=seen_holding_since) == [] and asked == []  # not late yet
    assert dog.overdue([stuck], now=3.0, silent_hold_since=seen_holding_since) == []  # held only 0.9 s
    assert dog.overdue([stuck], now=4.2, silent_hold_since=seen_holding_since) == [stuck]
    assert dog.overdue([stuck], now=9.0, silent_hold_since=lambda inst: None) == []  # another model holds them


def test_a_slot_is_hopeless_only_after_load_failures_in_a_row():
    slot = Slot()
    for _ in range(2):
        slot.failed(StartFailed("instance 0 failed to start: FileNotFoundError: x"))
    assert not slot.hopeless(3)
    slot.failed(StartFailed("instance 0 exited while starting (killed by SIGKILL)", by_signal=True))
    assert not slot.hopeless(3)  # killed from outside: not the model's fault
    slot.failed(StartFailed("instance 0 failed to start: FileNotFoundError: x"))
    assert slot.hopeless(3) and "FileNotFoundError" in slot.last_error
    slot.failed(StartFailed("instance 0 exited while starting (killed by SIGKILL)", by_signal=True))
    assert not slot.hopeless(3)  # its last attempt has a fair chance again
