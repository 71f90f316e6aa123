"""Who runs what: the queue of requests, each instance's share of it, the gather window, deadlines,
and re-queueing the requests of an instance that died or hung. Pure: works on any objects with
``config`` (batch, slots), ``idle``, ``jobs`` and ``submit(jobs)``, so it is tested with fakes.

Dispatch is work-conserving: queued requests go to the instances as they become idle, each taking
up to its planned share (``split_sizes`` over the idle instances; beyond the plan, up to its
capacity when the queue is longer). One refinement, measured (BENCHMARKS.md, dispatch modes): an
idle instance whose planned share has not all arrived waits up to ``gather_s`` (30 ms) for the rest
before it starts. In a closed loop the requests of a wave arrive milliseconds apart; starting on
the first alone made a fat ⟨2 threads, batch 4⟩ instance run batches of one and two, 1.1-1.4x
slower at p50 than whole batches, while 30 ms recovered them. Under a queue nothing waits, and
nothing waits for requests that are not coming: the wait holds only while fewer requests are in
the pool (queued or running) than there were at its recent hand-outs (RECENT_WAVES). One
closed-loop user never has more than its one request in: it waited the whole window at every
request (packrat's KServe server at 1 user, 50 ms a request against 1.4 for a plain server;
docs/benchmarks/peers.md, issue 63).

A request is admitted only when it can be answered within its deadline (admission.py: the queue
ahead, the running batches and the plan's round as served; a request reaching an idle pool always,
a probe); the rest are refused 503 at once, and counted by cause. Every request has a deadline
(``request_timeout_s`` after the front end received it, or the client's own if tighter): one not
answered by then, queued or running, is answered 504 with the reason, so nothing waits forever. A
request whose instance died or hung goes back to the front of the queue; one that has been on
``max_attempts`` lost instances (it may be what kills them) is answered 500 instead.
"""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol, Sequence

from packrat.serving.pool.admission import SWING, UNAVAILABLE, Admission, Outlook, Refusal
from packrat.serving.pool.api import Answer, InstanceConfig, Request
from packrat.settings import GATHER_MS, MAX_QUEUE, REQUEST_TIMEOUT_S  # the defaults, declared with the schema

MAX_ATTEMPTS = 3  # lost instances one request may be part of before it is answered 500
RECENT_WAVES = 8  # hand-outs whose requests in the pool tell how many a wave brings


@dataclass(eq=False)
class Job:
    request: Request
    future: Future
    queued_at: float
    deadline: float
    attempts: int = 0

    def resolve(self, answer: Answer) -> bool:
        """Answer it, once (later answers, e.g. from an instance given up on, are dropped)."""
        try:  # one look under the future's lock: done() first took it twice
            self.future.set_result(answer)
        except InvalidStateError:
            return False
        return True


class Runner(Protocol):
    config: InstanceConfig
    jobs: list

    @property
    def idle(self) -> bool: ...

    def submit(self, jobs: list) -> None: ...


def split_sizes(n: int, planned: Sequence[int], capacities: Sequence[int] | None = None) -> list[int]:
    """How many of `n` requests each instance runs, given the planned batch sizes.

    Shares are proportional to the plan (largest remainders first). Below the planned
    total, every instance gets at least one request while there are requests to give, so
    no core idles when there is work for it, and none gets more than its planned batch.
    Above it, shares grow in proportion up to each instance's capacity (the caller
    never passes more than the capacities hold).
    """
    total = sum(planned)
    # The common cases at once, without the arithmetic: one instance, or the planned batch
    if len(planned) == 1 and (capacities is None or n <= capacities[0]):
        return [n]
    if n == total and (capacities is None or all(p <= c for p, c in zip(planned, capacities))):
        return list(planned)
    if n >= total:
        return _proportional(n, planned, capacities or [n] * len(planned))
    sizes = [0] * len(planned)
    for i in sorted(range(len(planned)), key=lambda i: -planned[i])[:n]:  # one each, biggest first
        sizes[i] = 1
    extra = _proportional(n - sum(sizes), [p - s for p, s in zip(planned, sizes)], None)
    return [s + e for s, e in zip(sizes, extra)]


def _proportional(n: int, weights: Sequence[int], caps: Sequence[int] | None) -> list[int]:
    """n split in proportion to weights (largest remainders), never above caps."""
    caps = list(caps) if caps is not None else list(weights)
    sizes = [0] * len(weights)
    left = n
    while left > 0:
        open_ = [i for i in range(len(weights)) if sizes[i] < caps[i] and weights[i] > 0]
        if not open_:
            raise ValueError(f"{n} samples do not fit capacities {caps}")
        weight = sum(weights[i] for i in open_)
        exact = {i: left * weights[i] / weight for i in open_}
        share = {i: min(int(exact[i]), caps[i] - sizes[i]) for i in open_}
        for i in sorted(open_, key=lambda i: exact[i] - int(exact[i]), reverse=True)[: left - sum(share.values())]:
            if share[i] < caps[i] - sizes[i]:
                share[i] += 1
        for i in open_:
            sizes[i] += share[i]
        left = n - sum(sizes)
    return sizes


@dataclass
class Counts:
    admitted: int = 0
    answered: int = 0
    refused: int = 0  # 503: not answerable in time, queue full, or no instance can run
    refused_late: int = 0  # of those, not answerable in time (the prediction)
    expired: int = 0  # 504: past the deadline (admitted, or already before it reached the pool)
    requeued: int = 0
    refusals: Counter = field(default_factory=Counter)  # the 503s, and the 504s before admission, by cause


class Dispatcher:
    """The queue and its hand-out to instances. Not thread-safe: the pool calls it under its lock."""

    def __init__(self, gather_ms: float = GATHER_MS, request_timeout_s: float = REQUEST_TIMEOUT_S,
                 max_queue: int = MAX_QUEUE, max_attempts: int = MAX_ATTEMPTS,
                 clock: Callable[[], float] = time.monotonic, admission: str = "predicted",
                 jitter: Callable[[], float] = random.random, swing: float = SWING):
        self.gather_s, self.request_timeout_s = gather_ms / 1e3, request_timeout_s
        self.max_queue, self.max_attempts, self.clock = max_queue, max_attempts, clock
        self.admission = Admission(request_timeout_s, max_queue, by_prediction=admission == "predicted",
                                   swing=swing, jitter=jitter)
        self.queue: deque[Job] = deque()
        self.counts = Counts()
        self.waves: deque[int] = deque(maxlen=RECENT_WAVES)  # requests in the pool at recent hand-outs

    def refusal(self, outlook: Outlook = Outlook(), received_at: float | None = None,
                timeout_s: float | None = None) -> Answer | None:
        """The answer refusing a request arriving now (counted), or None: it would be admitted.
        `received_at`: when the front end received it (this clock's time; None: now); `timeout_s`:
        the client's own deadline after that, if it sent one."""
        return self._refusal(outlook, received_at, timeout_s, self.clock())

    def _refusal(self, outlook: Outlook, received_at: float | None, timeout_s: float | None,
                 now: float) -> Answer | None:
        waited_s = 0.0 if received_at is None else max(0.0, now - received_at)
        refusal = self.admission.verdict(len(self.queue), outlook, waited_s, timeout_s)
        if refusal is None:
            return None
        self._count(refusal)
        return Answer.error(refusal.status, refusal.reason, refusal.retry_after_s)

    def _count(self, refusal: Refusal) -> None:
        self.counts.refusals[refusal.cause] += 1
        if refusal.status == 504:
            self.counts.expired += 1
            return
        self.counts.refused += 1
        self.counts.refused_late += refusal.late

    def unavailable(self, reason: str) -> Answer:
        """The answer refusing a request no instance can run now (counted)."""
        self.counts.refused += 1
        self.counts.refusals[UNAVAILABLE] += 1
        return Answer.error(503, reason)

    def enqueue(self, request: Request, outlook: Outlook = Outlook()) -> Job:
        """A job for the request: queued, or answered at once when it would not be answered in time
        (or the queue is full)."""
        now = self.clock()
        received = now if request.received_at is None else request.received_at
        job = Job(request, Future(), now, received + self.admission.timeout_for(request.timeout_s))
        refused = self._refusal(outlook, received, request.timeout_s, now)
        if refused is not None:
            job.resolve(refused)
        else:
            self.queue.append(job)
            self.counts.admitted += 1
        return job

    def refuse(self, job: Job, reason: str) -> None:
        """An admitted job answered 503: no instance can run it (the pool is unavailable, or closing)."""
        if job.resolve(Answer.error(503, reason)):
            self.counts.refused += 1
            self.counts.refusals[UNAVAILABLE] += 1

    def refuse_queued(self, reason: str) -> int:
        """Answer every queued request 503 with the reason; how many there were."""
        refused = len(self.queue)
        while self.queue:
            self.refuse(self.queue.popleft(), reason)
        return refused

    def assign(self, runners: Iterable[Runner]) -> float | None:
        """Give queued requests to the idle runners, split by their planned shares. Returns how
        long to look again after, while a gather window is open, else None."""
        if not self.queue:  # each answered sub-batch asks: mostly nothing is waiting
            return None
        runners = list(runners)
        idle = [runner for runner in runners if runner.idle]
        if not idle:
            return None
        waited = self.clock() - self.queue[0].queued_at
        in_pool = len(self.queue) + sum(len(r.jobs) for r in runners)
        coming = not self.waves or in_pool < max(self.waves)  # unknown at first: a wave may be on its way
        if len(self.queue) < sum(r.config.batch for r in idle) and waited < self.gather_s and coming:
            return self.gather_s - waited  # the rest of the wave is probably on its way
        self.waves.append(in_pool)
        n = min(len(self.queue), sum(r.config.slots for r in idle))
        sizes = split_sizes(n, [r.config.batch for r in idle], [r.config.slots for r in idle])
        for runner, size in zip(idle, sizes):
            if size:
                jobs = [self.queue.popleft() for _ in range(size)]
                try:
                    runner.submit(jobs)
                except OSError:  # its socket is broken: it died; the pool will see it and requeue
                    runner.jobs = jobs
        return None

    def answered(self, jobs: list[Job], answers: Sequence[Answer]) -> None:
        for job, answer in zip(jobs, answers):
            if job.resolve(answer):
                self.counts.answered += 1

    def requeue(self, jobs: list[Job], why: str) -> None:
        """Jobs of a lost instance back to the front of the queue, in order; a job on its
        max_attempts-th lost instance is answered 500 instead."""
        for job in reversed(jobs):
            if job.future.done():
                continue
            job.attempts += 1
            if job.attempts >= self.max_attempts:
                job.resolve(Answer.error(500, f"{self.max_attempts} model instances were lost while running this "
                                              f"request (last: {why})"))
            else:
                self.counts.requeued += 1
                self.queue.appendleft(job)

    def expire(self, running: Iterable[Job]) -> float | None:
        """Answer 504 every request, queued or running, past its deadline. Returns the seconds until
        the next deadline of a queued request (None when the queue is empty)."""
        now = self.clock()
        for where, jobs in (("queued", list(self.queue)), ("running", list(running))):
            for job in jobs:
                if now >= job.deadline and job.resolve(Answer.error(
                        504, f"not answered within {self.admission.timeout_for(job.request.timeout_s):g} s "
                             f"({where}; {job.attempts} instance(s) lost while running it)")):
                    self.counts.expired += 1
        self.queue = deque(job for job in self.queue if not job.future.done())
        return min(job.deadline for job in self.queue) - now if self.queue else None
