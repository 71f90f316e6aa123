"""The controller: follows the load by switching the pool to the plan for the batch
size the estimator sees, without dropping a request.

Every request goes to the live pool. When the estimator proposes a new target batch B',
a background thread computes the plan for B' and asks the pool to reconfigure
(`InstancePool.reconfigure`): instances that keep their threads and cores are reused
(only their share of the batch changes, so a plan that differs only in batch sizes, or
in the number of identical instances, costs no new process); so are the instances the
previous switch parked, so going back and forth between two plans costs nothing; the
others are started beside the live ones at low priority (nice 10) so their warm-up
yields the shared cores to the live pool, then swapped in between two batches, after
which the old ones finish their batch and are parked. A new instance that fails to
start leaves the old pool serving; the switch is retried after `retry_s`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Protocol

from packrat.planning.planner import Plan
from packrat.serving.estimator import BatchSizeEstimator

log = logging.getLogger(__name__)
REQUEST_ATTEMPTS = 3  # an operator's switch is tried this many times before it is given up


class Pool(Protocol):
    outstanding: int  # requests queued or running

    def submit(self, request): ...  # a concurrent.futures.Future of an answer with .status

    def health(self): ...

    def reconfigure(self, configs) -> dict: ...


@dataclass
class Reconfiguration:
    from_batch: int
    to_batch: int
    reason: str
    seconds: float  # new target decided → new plan serving (or failure noticed)
    failed_requests: int  # requests that failed while the switch was under way
    started_at: float  # unix time, for timelines
    plan: str = ""  # the new plan, e.g. "2×⟨1 threads, batch 4⟩"
    error: str | None = None  # why the new pool could not start, if it could not


class Controller:
    def __init__(self, pool: Pool, plan: Plan, plan_for: Callable[[int], Plan],
                 configs_for: Callable[[Plan], list], estimator: BatchSizeEstimator, *,
                 retry_s: float = 10.0, clock: Callable[[], float] = time.monotonic, history: int = 100,
                 request_attempts: int = REQUEST_ATTEMPTS, sleep: Callable[[float], None] = time.sleep):
        self.pool, self.plan = pool, plan
        self.plan_for, self.configs_for, self.estimator = plan_for, configs_for, estimator
        self.retry_s, self.clock, self.sleep = retry_s, clock, sleep
        self.request_attempts = request_attempts
        self.reconfigurations: list[Reconfiguration] = []
        self._history = history
        self._switching: threading.Thread | None = None
        self._building = plan.batch  # target of the switch under way
        self._retry_at = 0.0
        self._failed_during_switch = 0
        self._lock = threading.Lock()

    # ---- serving ------------------------------------------------------------------------------

    def arrive(self, count: int = 1) -> None:
        """`count` requests arrived together (TorchServe's batch; one by one from Ray Serve's
        front end); may start a switch in the background. The load is them plus the requests already in
        the pool: with U users in a closed loop that is about U, the batch the plan should be made for."""
        self.estimator.observe(self.pool.outstanding + count, self.clock())
        self._maybe_switch()

    def submit(self, request):
        """Queue one request on the live pool: a future of its answer (counted if it fails while a
        switch is under way). arrive() says how many came together."""
        future = self.pool.submit(request)
        future.add_done_callback(self._count_failure)
        return future

    def submit_all(self, requests) -> list:
        """Queue requests that arrived together on the live pool, as one batch (InstancePool.submit_all)."""
        futures = self.pool.submit_all(requests)
        for future in futures:
            future.add_done_callback(self._count_failure)
        return futures

    def _count_failure(self, future) -> None:
        if future.result().status >= 500:
            with self._lock:
                if self._switching is not None:
                    self._failed_during_switch += 1

    def _maybe_switch(self) -> None:
        now = self.clock()
        target = self.estimator.check(now)
        if target is None:
            return
        with self._lock:
            if self._switching is not None:  # judge later proposals against the plan on its way
                self.estimator.current = self._building
                return
            if now < self._retry_at:  # failed recently: ask again at a later check
                self.estimator.current = self.plan.batch
                return
            self._start_switch(target, f"estimated batch size {target} "
                                       f"(moving average {self.estimator.average:.1f})")

    def request(self, target: int, reason: str, plan_for: Callable[[int], Plan] | None = None,
                attempts: int | None = None) -> bool:
        """Switch to the plan for `target` now (an operator's request; `plan_for`'s plan, default
        the controller's), in the background; False while a switch is under way. A failed attempt
        (say, a new instance killed while it loads) is tried again retry_s later, up to `attempts`
        (default request_attempts) in all, each one recorded. The estimator then judges later load
        against the new plan."""
        with self._lock:
            if self._switching is not None:
                return False
            self.estimator.current = target
            self._start_switch(target, reason, attempts or self.request_attempts, plan_for)
            return True

    @property
    def switching(self) -> bool:
        """Whether a switch is under way."""
        return self._switching is not None

    def _start_switch(self, target: int, reason: str, attempts: int = 1,
                      plan_for: Callable[[int], Plan] | None = None) -> None:
        """Caller holds the lock and has checked no switch is under way."""
        self._building = target
        self._switching = threading.Thread(target=self._switch_in_background,
                                           args=(target, reason, attempts, plan_for), daemon=True,
                                           name="packrat-reconfigure")
        self._switching.start()

    def _switch_in_background(self, target: int, reason: str, attempts: int,
                              plan_for: Callable[[int], Plan] | None = None) -> None:
        try:
            for attempt in range(1, attempts + 1):
                record = self.switch(target, reason if attempt == 1 else f"{reason}, attempt {attempt}", plan_for)
                if record.error is None or attempt == attempts:
                    return
                self.sleep(self.retry_s)
                self.estimator.current = target  # switch() put back the old batch when it failed
        finally:
            with self._lock:
                self._switching = None

    def replan(self, reason: str, plan_for: Callable[[int], Plan] | None = None,
               committed: Callable[[], None] | None = None) -> Reconfiguration:
        """Serve the plan for today's batch again, as `plan_for` (default: the controller's) makes
        it now (say, the node moved this model's cores), waiting for a switch under way to end
        first; blocks until it serves. `committed()` runs once the new plan serves, before any other
        switch may start (so a switch that follows the load plans where this one went)."""
        while True:
            with self._lock:
                if self._switching is None:
                    self._switching, target = threading.current_thread(), self.plan.batch
                    self._building = target
                    break
            self.wait_idle(1.0)
        try:
            record = self.switch(target, reason, plan_for)
            if record.error is None and committed is not None:
                committed()
            return record
        finally:
            with self._lock:
                self._switching = None

    # ---- switching ----------------------------------------------------------------------------

    def switch(self, target: int, reason: str, plan_for: Callable[[int], Plan] | None = None) -> Reconfiguration:
        """Serve the plan for `target` from now on (one attempt; runs in the background thread)."""
        started, wall = self.clock(), time.time()
        old = self.plan
        record = Reconfiguration(old.batch, target, reason, 0.0, 0, wall)
        try:
            plan = (plan_for or self.plan_for)(target)
            record.plan = plan.describe()
            self.pool.reconfigure(self.configs_for(plan))
            self.plan = plan
            log.info("reconfigured B=%d → B=%d (%s): %s in %.2f s", old.batch, target, reason,
                     plan.describe(), self.clock() - started)
        except Exception as exc:  # the old pool keeps serving
            record.error = f"{type(exc).__name__}: {exc}"
            self.estimator.current = old.batch
            self._retry_at = self.clock() + self.retry_s
            log.error("reconfiguration B=%d → B=%d failed, old plan keeps serving, may retry in %.0f s: %s",
                      old.batch, target, self.retry_s, record.error)
        with self._lock:
            record.seconds = self.clock() - started
            record.failed_requests, self._failed_during_switch = self._failed_during_switch, 0
            self.reconfigurations = (self.reconfigurations + [record])[-self._history:]
        return record

    def wait_idle(self, timeout: float | None = None) -> None:
        """Until no switch is under way (for tests and shutdown)."""
        thread = self._switching
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ---- reporting ----------------------------------------------------------------------------

    def status(self) -> dict:
        """{"plan": <as packrat plan --json>, "mode": how instances run the model (script, eager
        or ios), "health": the pool's (pool.Health), "reconfigurations": [...]} (newest last)."""
        with self._lock:
            records = list(self.reconfigurations)
        return {"plan": self.plan.to_json(), "mode": self.pool.mode, "health": asdict(self.pool.health()),
                "reconfigurations": [asdict(r) for r in records]}
