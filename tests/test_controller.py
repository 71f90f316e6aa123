"""The controller with fake pools: switch order, failure of the new pool, drain."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from types import SimpleNamespace


from packrat.serving.controller import Controller
from packrat.serving.pool.api import Health
from packrat.serving.estimator import BatchSizeEstimator, EstimatorSettings
from packrat.planning.planner import Planner

ITEMS = [(t, b, b * 10.0 / t ** 0.5) for t in (1, 2, 4) for b in (1, 2, 4, 8)]
PLANNER = Planner(ITEMS, 4, 8)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakePool:
    """Records what happens; reconfigure can be made to block or fail."""

    def __init__(self):
        self.events: list[str] = []
        self.mode = "eager"  # how InstancePool reports its instances run the model
        self.configs = None
        self.fail_next = False
        self.gate = threading.Event()
        self.gate.set()
        self.building = threading.Event()  # set once a build has begun (it runs on another thread)

    outstanding = 0  # requests in the pool: the load the estimator sees
    status = 200

    def submit(self, request):
        self.events.append(f"submit at {self.outstanding + 1}")
        future = Future()
        future.set_result(SimpleNamespace(status=self.status))
        return future

    def health(self):
        return Health(1, 1, 0, 0, None, 0, 0, 0)

    def reconfigure(self, configs):
        self.events.append("build")
        self.building.set()
        self.gate.wait(10)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("instance 0 failed to start: out of memory")
        self.configs = configs
        self.events.append("switch")
        return {}


def make(pool, clock, current=1, window=1):
    estimator = BatchSizeEstimator(current, 8, EstimatorSettings(alpha=1.0, window=window, period_s=1.0))
    return Controller(pool, PLANNER.plan(4, current), lambda b: PLANNER.plan(4, b),
                      lambda plan: [(i.threads, i.batch) for i in plan.instances], estimator,
                      retry_s=5.0, clock=clock)


def arrive(controller, load):
    """One request arrives while `load` - 1 others are in the pool."""
    controller.pool.outstanding = load - 1
    controller.arrive()
    return controller.submit("request")


def drive(controller, clock, size, seconds):
    for _ in range(seconds):
        arrive(controller, size)
        clock.now += 1.0
        controller.wait_idle(10)


def test_switches_to_the_plan_for_the_new_batch_and_records_it():
    pool, clock = FakePool(), Clock()
    controller = make(pool, clock)
    drive(controller, clock, 1, 3)
    assert controller.reconfigurations == []
    drive(controller, clock, 8, 3)
    assert controller.plan.batch == 8
    assert pool.configs == [(i.threads, i.batch) for i in PLANNER.plan(4, 8).instances]
    (record,) = controller.reconfigurations
    assert (record.from_batch, record.to_batch, record.failed_requests, record.error) == (1, 8, 0, None)
    assert "estimated batch size 8" in record.reason and record.seconds >= 0
    status = controller.status()
    assert status["plan"] == PLANNER.plan(4, 8).to_json() and status["mode"] == "eager"
    assert status["reconfigurations"][0]["to_batch"] == 8


def test_a_whole_batch_arriving_at_once_is_the_load():
    """TorchServe's ordinary mode hands over a batch of 8 into an empty pool: the load is 8, not
    the 1..8 the pool held as its requests were queued one by one."""
    pool, clock = FakePool(), Clock()
    controller = make(pool, clock)
    for _ in range(3):
        controller.arrive(8)
        for _ in range(8):
            controller.submit("request")
        clock.now += 1.0
        controller.wait_idle(10)
    assert controller.plan.batch == 8 and controller.reconfigurations[0].to_batch == 8


def test_batches_keep_flowing_to_the_old_pool_while_the_new_one_builds():
    pool, clock = FakePool(), Clock()
    controller = make(pool, clock)
    pool.gate.clear()  # the new pool takes its time
    arrive(controller, 1)
    clock.now += 1
    arrive(controller, 8)  # proposes 8 (window 1): the build starts in the background
    clock.now += 1
    arrive(controller, 8)
    arrive(controller, 8)
    assert pool.building.wait(10)  # the background build has begun, without holding batches up
    assert pool.events.count("submit at 8") == 3
    assert "switch" not in pool.events  # all three ran on the old pool
    pool.gate.set()
    controller.wait_idle(10)
    assert pool.events[-1] == "switch"
    assert controller.plan.batch == 8


def test_a_failed_new_pool_leaves_the_old_plan_serving_and_retries_later():
    pool, clock = FakePool(), Clock()
    controller = make(pool, clock)
    pool.fail_next = True
    drive(controller, clock, 8, 3)
    assert controller.plan.batch == 1  # old plan still serving
    failed = controller.reconfigurations[0]
    assert failed.error and "out of memory" in failed.error
    builds = pool.events.count("build")
    drive(controller, clock, 8, 3)  # within retry_s: no new attempt
    assert pool.events.count("build") == builds
    drive(controller, clock, 8, 4)  # after it: retried and switched
    assert controller.plan.batch == 8
    assert controller.reconfigurations[-1].error is None


def test_no_flapping_between_two_plans_under_steady_load():
    pool, clock = FakePool(), Clock()
    controller = make(pool, clock, current=4, window=10)
    drive(controller, clock, 4, 60)
    assert controller.reconfigurations == [] and "build" not in pool.events


def blocked_switch_to_8():
    """A controller whose switch to the plan for 8 has started and blocks (until pool.gate is set)."""
    pool, clock = FakePool(), Clock()
    controller = make(pool, clock)
    pool.gate.clear()
    arrive(controller, 1)
    clock.now += 1
    arrive(controller, 8)
    return controller, pool, clock


def test_failed_answers_during_a_switch_are_counted_against_it():
    controller, pool, _ = blocked_switch_to_8()
    pool.status = 503
    arrive(controller, 8)
    arrive(controller, 8)
    pool.status = 200
    arrive(controller, 8)
    pool.gate.set()
    controller.wait_idle(10)
    assert controller.reconfigurations[-1].failed_requests == 2


def test_a_step_back_during_a_slow_switch_is_followed_afterwards():
    controller, pool, clock = blocked_switch_to_8()
    for _ in range(3):  # the load drops back to 1 while the build is still running
        clock.now += 1
        arrive(controller, 1)
    pool.gate.set()
    controller.wait_idle(10)
    assert controller.plan.batch == 8
    drive(controller, clock, 1, 3)  # the estimator must still see 1 as a change from 8
    assert controller.plan.batch == 1
    assert [r.to_batch for r in controller.reconfigurations] == [8, 1]


def test_an_operators_request_switches_now_and_not_twice_at_once():
    pool, clock = FakePool(), Clock()
    controller = make(pool, clock, current=8)
    pool.gate.clear()  # the first switch blocks while it builds
    assert controller.request(2, "requested by packrat reconfigure (batch 2)")
    assert not controller.request(4, "requested again")  # one switch at a time: asked again later
    pool.gate.set()
    controller.wait_idle(10)
    assert controller.plan.batch == 2 and controller.estimator.current == 2
    (record,) = controller.reconfigurations
    assert (record.from_batch, record.to_batch) == (8, 2) and "packrat reconfigure" in record.reason


def test_an_operators_request_that_fails_is_tried_again():
    """A new instance killed while it loads fails the switch; a requested one is tried again
    retry_s later (each attempt recorded), where an estimated one waits for the next estimate."""
    pool, clock = FakePool(), Clock()
    naps: list[float] = []
    controller = make(pool, clock, current=8)
    controller.sleep = naps.append
    pool.fail_next = True
    assert controller.request(2, "requested by packrat reconfigure (batch 2)")
    controller.wait_idle(10)
    assert controller.plan.batch == 2 and naps == [5.0]
    failed, done = controller.reconfigurations
    assert failed.error and done.error is None and done.reason.endswith("attempt 2")


def test_an_operators_request_is_given_up_after_its_attempts():
    pool, clock = FakePool(), Clock()
    controller = make(pool, clock, current=8)
    controller.sleep = lambda s: setattr(pool, "fail_next", True)  # every attempt fails
    pool.fail_next = True
    assert controller.request(2, "requested")
    controller.wait_idle(10)
    assert controller.plan.batch == 8 and controller.estimator.current == 8
    assert len(controller.reconfigurations) == 3 and all(r.error for r in controller.reconfigurations)
    assert controller.request(4, "requested again")  # free for the next one
    controller.wait_idle(10)
