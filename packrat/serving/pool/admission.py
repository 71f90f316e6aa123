"""Admission by prediction: a request is taken only when it can be answered within its deadline.

Under overload a server's one job is to answer what it can in time and refuse the rest at once.
A fixed queue bound holds on the machine it was sized on and not on a slower one (issue 56), so the
pool predicts instead: a new request is answered after the batches running now finish, then after
the queued requests and itself go through in whole rounds of the plan's batch,

    answer in = busy left + ceil((queued + 1) / B) × round

where a round is the time one planned batch takes through the pool: the plan's latency (the
profile's) times what the pool served over what the profile predicted (``ServedRounds``, from the
recent sub-batches, so a slower machine, a CPU-bound neighbour, JSON decoding or a longer hop
are all in it). A request whose prediction, SWING times over (the pace a third slower than predicted),
does not fit the time it has left is refused 503 with a
``Retry-After`` from the same prediction, spread by a random share so that refused clients do not
all come back in the same second: it costs no core. ``max_queue`` stays an upper bound.

A request's time counts from when the front end received it (``Request.received_at``): receiving
and parsing its body, waiting for the GIL, TorchServe's own queue (bounded by ``UpstreamWait``) are
all spent from its deadline. Its deadline is the server's ``request_timeout_s`` or the client's own
(a gRPC deadline, Triton's ``timeout`` parameter), whichever is tighter.

The prediction corrects itself. While nothing runs or waits in the pool, a request is admitted
whatever the prediction says (a probe): a ratio that predicts a miss for an idle pool would
otherwise refuse every request, no batch would be served, and the ratio would never change. Probes
are ordinary admitted requests, in the admitted count and, if late, in the 504s. And while the pool
is idle the ratio decays towards the plan (``DECAY_HALF_LIFE_S``): nothing served confirms it.

Pure: plain numbers in, a verdict out (clocks and the jitter are passed in); tested with tables.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

IDLE_SLACK_S = 0.1  # beyond TorchServe's batch delay: a batch handed over later found its queue empty
SMOOTHING = 0.2  # weight of the newest sub-batch in the served/predicted ratio (the first one's too)
RATIO_BOUNDS = (0.05, 100.0)  # a runaway stops here; the top is far: JSON bodies, decoded in the instance and
# not in the profile, took 12x the model's time, and 19-24x on a slowed machine, where a bound of 20 admitted 504s
PARTIAL_SCALE = 2.0  # a partial sub-batch's time counts at most twice for the planned batch: its fixed
# cost (the hop, the model's per-call overhead) does not grow with the batch, so scaling by B / n overshoots
STEP_BOUND = 4.0  # a sample counts as at most 4× the ratio it joins: one stalled sub-batch moves the prediction
# (and its deviation) little, a lasting slow-down is followed within a few (a fast sample needs no bound: the lower
# ratio it brings is offset by the deviation it adds)
DECAY_HALF_LIFE_S = 10.0  # an idle pool's ratio halves its distance to the plan this often: long beside a
# batch (ms to a second), short beside a refused client's retries
SWING = 4 / 3  # a request is admitted where its answer would still be in time at the pool's pace a third
# slower than predicted, all the way: under 3x load the pace swings by whole seconds (a client's burst, a
# neighbour), and the rounds queued then miss together; a queue past a round or two adds no throughput anyway
CYCLES = 32  # the served cycles of TorchServe's queue (full batch after full batch) whose median is its pace
RETRY_JITTER = 0.5  # Retry-After: the predicted drain plus up to half of it (at least up to a second more)

# why a request was not admitted: the admission's causes, and the pool's own (no instance can run it)
LATE, QUEUE_FULL, EXPIRED_BEFORE, UNAVAILABLE = "late", "queue_full", "expired_before", "unavailable"
CAUSES = (LATE, QUEUE_FULL, EXPIRED_BEFORE, UNAVAILABLE)


@dataclass(frozen=True)
class Refusal:
    status: int  # 503: refused, try again after retry_after_s; 504: its deadline passed already
    reason: str
    retry_after_s: int  # whole seconds, as the Retry-After header takes them
    cause: str = LATE  # one of CAUSES: what the metrics count it under

    @property
    def late(self) -> bool:
        """Refused by the prediction (not the queue bound, not an expired wait)."""
        return self.cause == LATE


@dataclass(frozen=True)
class Outlook:
    """What the pool looks like to a request arriving now."""
    busy_left_s: float = 0.0  # until the batches running now are predicted to finish
    batch: int = 1  # the plan's batch: the requests one round takes
    round_s: float | None = None  # one round's time, as served; None: nothing to predict with
    idle: bool = False  # nothing runs or waits in the pool: a request now is a probe, admitted


def answer_in_s(queued: int, busy_left_s: float, batch: int, round_s: float) -> float:
    """Seconds until a request arriving now is answered: the running batches' rest, then whole
    rounds of the plan's batch for the queued requests and this one."""
    return busy_left_s + math.ceil((queued + 1) / max(batch, 1)) * round_s


def retry_after(excess_s: float, jitter: float = 0.0) -> int:
    """Whole seconds after which the queue ahead has drained by `excess_s` of work, spread by
    `jitter` (uniform in [0, 1)) over up to RETRY_JITTER of it more, and at least a second more,
    so clients refused together do not return together; at least 1."""
    return max(1, math.ceil(excess_s + jitter * max(RETRY_JITTER * excess_s, 1.0)))


@dataclass(frozen=True)
class Admission:
    """The rule: the queue bound always; with `by_prediction`, the deadline as well."""
    timeout_s: float
    max_queue: int
    by_prediction: bool = True
    swing: float = SWING  # the prediction times this must fit the time left
    jitter: Callable[[], float] = field(default=random.random, compare=False)  # Retry-After's spread, in [0, 1)

    def timeout_for(self, client_timeout_s: float | None = None) -> float:
        """A request's time from its receipt to its answer: the server's, or the client's if tighter."""
        return self.timeout_s if client_timeout_s is None else min(self.timeout_s, client_timeout_s)

    def verdict(self, queued: int, outlook: Outlook, waited_s: float = 0.0,
                client_timeout_s: float | None = None) -> Refusal | None:
        """None to admit; else why not. `waited_s`: time since the front end received it;
        `client_timeout_s`: the client's own deadline after that, if it sent one. A round of None (no
        plan latency, nothing served yet): the queue bound alone. An idle pool admits (a probe)."""
        batch, round_s = outlook.batch, outlook.round_s
        timeout_s = self.timeout_for(client_timeout_s)
        left_s = timeout_s - waited_s
        if left_s <= 0:
            return Refusal(504, f"waited {waited_s:.2f} s before reaching the model, past its {timeout_s:g} s "
                                f"deadline", 1, EXPIRED_BEFORE)
        if queued >= self.max_queue:
            drain_s = answer_in_s(queued - self.max_queue, 0.0, batch, round_s or 0.0)
            return Refusal(503, f"too many requests waiting ({queued}, the limit); try again later",
                           retry_after(drain_s, self.jitter()), QUEUE_FULL)
        if outlook.idle and queued == 0:  # a probe: what it takes is the ratio's next sample
            return None
        if not self.by_prediction or round_s is None:
            return None
        predicted_s = answer_in_s(queued, outlook.busy_left_s, batch, round_s)
        if predicted_s * self.swing <= left_s:
            return None
        return Refusal(503, f"would be answered in {predicted_s:.2f} s ({predicted_s * self.swing:.2f} s at a "
                            f"{self.swing:.2f}x slower pace), past its {left_s:.2f} s left ({queued} queued, "
                            f"{round_s * 1e3:.0f} ms a batch of {batch}); try again later",
                       retry_after(predicted_s * self.swing - left_s, self.jitter()), LATE)


def upstream_queue(timeout_s: float, round_s: float, batch: int, max_queue: int) -> int:
    """How many requests a FIFO queue ahead of the pool (TorchServe's job queue) may hold so that
    its last is answered within the deadline, batches taking `round_s`: it waits for the running
    batch and its queue's rounds, B × (floor(timeout / round) − 1); at least one batch (so the
    instances never wait for work), at most `max_queue`."""
    rounds = math.floor(timeout_s / round_s) - 1 if round_s > 0 else max_queue
    return max(batch, min(max_queue, batch * rounds))


class ServedRounds:
    """How long a planned batch takes through the pool against the plan's latency for it: one
    unitless ratio, served / predicted, over the recent sub-batches, and how far single ones stray
    from it. A round is predicted at the ratio plus that deviation, as TCP times a retransmission: a
    request admitted on a round's mean would miss its deadline whenever the rounds ahead of it came
    out a little slower.

    Each sub-batch is a sample: its time for its instance's planned batch over that instance's
    predicted latency. A partial sub-batch is scaled up to the planned batch, at most PARTIAL_SCALE
    times (it runs less efficiently per request, so it errs on the slow side: where requests reach
    the pool slower than it serves, as behind a congested front end, the batches are partial and
    slow both); a sub-batch beyond the plan, down in proportion. An instance with no predicted
    latency is expected to take what the first such planned share served took (`reference_s`), so
    its samples are ratios too, never seconds. Every sample is clamped to RATIO_BOUNDS and to at
    most STEP_BOUND times the ratio, and mixed in with SMOOTHING, the first one as well, from 1.0
    (the plan as predicted). While the pool is idle the ratio and its deviation decay back towards
    the plan (look()); a busy pool needs no decay: its sub-batches are samples, and a pool that
    refuses all it is sent is idle between its batches (the admission's probe)."""

    def __init__(self, smoothing: float = SMOOTHING, bounds: tuple[float, float] = RATIO_BOUNDS,
                 half_life_s: float = DECAY_HALF_LIFE_S):
        self.smoothing, self.bounds, self.half_life_s = smoothing, bounds, half_life_s
        self.ratio, self.deviation, self.seen = 1.0, 0.0, 0
        self.reference_s: float | None = None  # expected planned share of an instance with no plan latency
        self.settling_until = float("-inf")  # a new instance's first batches are not its pace (settle())
        self.looked_at: float | None = None  # when the ratio was last confirmed (a sample) or decayed

    def add(self, measured_s: float, requests: int, planned_batch: int, expected_s: float | None,
            now: float | None = None) -> None:
        """One sub-batch of `requests` answered `measured_s` after it was handed out (at `now`); its
        instance plans `planned_batch` in `expected_s` (None: no plan latency, see `reference_s`)."""
        if requests <= 0 or measured_s <= 0 or (now is not None and now < self.settling_until):
            return
        scale = planned_batch / requests
        share_s = measured_s * (min(scale, PARTIAL_SCALE) if scale > 1 else scale)  # the planned share's time
        if not expected_s:
            if self.reference_s is None:
                self.reference_s = share_s
            expected_s = self.reference_s
        sample = min(max(share_s / expected_s, self.bounds[0]), self.bounds[1], self.ratio * STEP_BOUND)
        self.deviation = self._mix(self.deviation, abs(sample - self.ratio))
        self.ratio = self._mix(self.ratio, sample)
        self.seen += 1
        if now is not None:
            self.looked_at = now

    def _mix(self, old: float, new: float) -> float:
        return (1 - self.smoothing) * old + self.smoothing * new

    def look(self, now: float, idle: bool) -> None:
        """The pool is looked at, at `now`: while it is idle (nothing runs, nothing waits) no
        sub-batch confirms the pace, so the ratio and its deviation decay towards the plan's (1.0,
        none), halving their distance every half_life_s since the last look or sample."""
        if idle and self.looked_at is not None and now > self.looked_at:
            kept = 0.5 ** ((now - self.looked_at) / self.half_life_s)
            self.ratio = 1.0 + (self.ratio - 1.0) * kept
            self.deviation *= kept
        self.looked_at = now

    def settle(self, until: float) -> None:
        """Leave out what is answered until then (a switch, a lost instance): the rounds keep the
        pace they had, not the first batches of instances that just started."""
        self.settling_until = max(self.settling_until, until)

    @property
    def margin_ratio(self) -> float:
        """The ratio a round is predicted at: the mean and one deviation, within RATIO_BOUNDS."""
        return min(self.ratio + self.deviation, self.bounds[1])

    def expected(self, expected_s: float | None) -> float | None:
        """An instance's predicted time for its planned share: its plan latency, else `reference_s`."""
        return expected_s or self.reference_s

    def round_s(self, expected_s: Sequence[float | None]) -> float | None:
        """A round of the plan: its slowest instance's predicted time, as served; None while no
        instance has a time to predict with (no plan latency, nothing served)."""
        known = [e for e in map(self.expected, expected_s) if e]
        return max(known) * self.margin_ratio if known else None

    def outlook(self, now: float, instances: Sequence[tuple[float | None, int, float | None]],
                idle: bool) -> Outlook:
        """What a request arriving at `now` sees: each ready instance as (its plan latency or None,
        its planned batch, when it began its running sub-batch or None); `idle`: nothing runs or
        waits anywhere in the pool (look())."""
        self.look(now, idle)
        batch = sum(planned for _, planned, _ in instances) or 1
        round_s = self.round_s([e for e, _, _ in instances])
        if round_s is None:
            return Outlook(batch=batch, idle=idle)
        margin = self.margin_ratio
        busy_left = [(self.expected(e) * margin if self.expected(e) else round_s) - (now - since)
                     for e, _, since in instances if since is not None]
        return Outlook(max([0.0, *busy_left]), batch, round_s, idle)


class UpstreamWait:
    """A bound on how long the requests of a batch waited in a FIFO queue of `capacity` ahead of
    this worker (TorchServe's job queue), from the batches the worker was handed before and, where
    known, from looks at how many requests that queue held (`seen`).

    A queue holds at most `capacity`: after a batch of n is taken, at most capacity − n are left
    (none after a batch short of `full`: the queue was empty). Once the batches taken since have
    taken all those, what comes now was not yet queued when that batch was taken: it waited at most
    since. A look at the queue (t, requests pending) does the same with what it held then. A look
    asked while the worker held a batch saw every request not yet handed over: TorchServe's
    ordinary worker gets its next batch only once it answered this one. Any other look counts a
    batch that may have been on its way to the worker as pending too. And a batch that TorchServe
    sent later than its batch delay (`delay_s`) after the worker's last answer found the queue
    empty then: its first request was taken as it arrived, and sent at most the delay later.

    Times are when TorchServe's Java side sent each batch, where the worker knows it: its Python
    side then reads the batch and decodes every JSON body (json.loads, one thread: 0.2 s for a 3 MB
    v2 JSON body on a busy 2-core machine) before the handler sees it, time its requests waited too,
    and a gap since the last answer that is not an idle queue. Without it, the empty-queue rule is
    not used (a batch of JSON bodies reached the handler over 0.15 s after each answer, and every
    wait was then taken for 0.15 s: requests that waited seconds were admitted, and answered 200 or
    504 past their deadline)."""

    def __init__(self, capacity: int, full: int, delay_s: float = 0.05, keep: int = 256):
        self.capacity, self.full, self.delay_s = capacity, full, delay_s
        self.rounds: deque[tuple[float, int]] = deque(maxlen=keep)  # (arrival, size), oldest first
        self.looks: deque[tuple[float, int]] = deque(maxlen=keep)  # (time, requests queued up to then)
        self.taken = 0  # requests handed to the worker so far
        self.holding_since: float | None = None  # when the batch the worker holds arrived; None: none held
        self.answered_at: float | None = None  # when the worker last answered

    def seen(self, at: float, pending: int) -> None:
        """A look at the queue asked at `at` (and answered since): `pending` requests were waiting in it."""
        holding = self.holding_since is not None and self.holding_since <= at
        self.looks.append((at, self.taken + pending + (0 if holding else self.full)))

    def answered(self, now: float) -> None:
        """The worker answered the batch it held, at `now`."""
        self.holding_since, self.answered_at = None, now

    def arrived(self, now: float, size: int, sent_at: float | None = None) -> float:
        """A batch of `size` reached the handler at `now`, sent by TorchServe at `sent_at` (None:
        not known): the most its requests can have waited upstream."""
        sent = self._sent(now, sent_at)
        waited = self._by_rounds(now)
        if sent is not None and self.answered_at is not None and sent - self.answered_at > self.delay_s + IDLE_SLACK_S:
            waited = min(waited, self.delay_s + IDLE_SLACK_S + now - sent)  # the queue was empty at the last answer
        for at, queued_up_to in reversed(list(self.looks)):  # a copy: looks come from another thread
            if queued_up_to <= self.taken:  # this batch was not yet queued at that look
                waited = min(waited, now - at)
                break
        self.rounds.append((now if sent is None else sent, size))
        self.taken += size
        self.holding_since = now if sent is None else sent
        return waited

    def _sent(self, now: float, sent_at: float | None) -> float | None:
        """When this batch was sent, where known: not before the last answer (TorchServe's ordinary
        worker gets its next batch only after it; an earlier time is an older message's)."""
        if sent_at is None or self.holding_since is not None:
            return None
        if self.answered_at is not None and sent_at < self.answered_at:
            return None
        return min(sent_at, now)

    def cycle_s(self) -> float | None:
        """How long the worker took from one full batch to the next, as served lately (the median of
        the last CYCLES): the pace TorchServe's queue drains at under load, its hand-over and the
        answer included. None before two full batches in a row."""
        rounds = list(self.rounds)[-CYCLES - 1:]
        gaps = [b[0] - a[0] for a, b in zip(rounds, rounds[1:]) if a[1] >= self.full and b[1] >= self.full]
        return statistics.median(gaps) if gaps else None

    def fitting(self, timeout_s: float, max_queue: int, swing: float = SWING) -> int | None:
        """The queue whose last request would be answered in time at the served cycle, `swing`
        slower (upstream_queue): what TorchServe's queue should hold; None before a cycle is known."""
        cycle = self.cycle_s()
        return None if cycle is None else upstream_queue(timeout_s, swing * cycle, self.full, max_queue)

    def _by_rounds(self, now: float) -> float:
        taken = 0
        for at, count in reversed(self.rounds):
            left = 0 if count < self.full else self.capacity - count
            if left <= taken:
                return now - at
            taken += count
        return now - self.rounds[0][0] if self.rounds else 0.0
