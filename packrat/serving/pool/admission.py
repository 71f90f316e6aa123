"""Admission by prediction: a request is taken only when it can be answered within its deadline.

Under overload a server's one job is to answer what it can in time and refuse the rest at once.
A fixed queue bound holds on the machine it was sized on and not on a slower one (issue 56), so the
pool predicts instead: a new request is answered after the batches running now finish, then after
the queued requests and itself go through in whole rounds of the plan's batch,

    answer in = busy left + ceil((queued + 1) / B) × round

where a round is the time one planned batch takes through the pool: the plan's latency (the
profile's) times what the pool served over what the profile predicted (``ServedRounds``, from the
recent sub-batches, so a slower machine, a CPU-bound neighbour, JSON decoding or a longer hop
are all in it). A request whose prediction does not fit the time it has left is refused 503 with a
``Retry-After`` from the same prediction: it costs no core. ``max_queue`` stays an upper bound.

A request that already waited upstream (TorchServe's own queue, before its Python worker sees
it) has that much less time; ``UpstreamWait`` bounds that wait from the rounds the worker saw.

Pure: plain numbers in, a verdict out; tested with tables.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

IDLE_SLACK_S = 0.1  # beyond TorchServe's batch delay: a batch handed over later found its queue empty
SMOOTHING = 0.2  # weight of the newest full sub-batch in the served/predicted ratio


@dataclass(frozen=True)
class Refusal:
    status: int  # 503: refused, try again after retry_after_s; 504: its deadline passed already
    reason: str
    retry_after_s: int  # whole seconds, as the Retry-After header takes them
    late: bool = False  # refused by the prediction (not the queue bound, not an expired wait)


@dataclass(frozen=True)
class Outlook:
    """What the pool looks like to a request arriving now."""
    busy_left_s: float = 0.0  # until the batches running now are predicted to finish
    batch: int = 1  # the plan's batch: the requests one round takes
    round_s: float | None = None  # one round's time, as served; None: nothing to predict with


def answer_in_s(queued: int, busy_left_s: float, batch: int, round_s: float) -> float:
    """Seconds until a request arriving now is answered: the running batches' rest, then whole
    rounds of the plan's batch for the queued requests and this one."""
    return busy_left_s + math.ceil((queued + 1) / max(batch, 1)) * round_s


def retry_after(excess_s: float) -> int:
    """Whole seconds after which the queue ahead has drained by `excess_s` of work (at least 1)."""
    return max(1, math.ceil(excess_s))


@dataclass(frozen=True)
class Admission:
    """The rule: the queue bound always; with `by_prediction`, the deadline as well."""
    timeout_s: float
    max_queue: int
    by_prediction: bool = True

    def verdict(self, queued: int, outlook: Outlook, waited_s: float = 0.0) -> Refusal | None:
        """None to admit; else why not. A round of None (no plan latency, nothing served yet):
        the queue bound alone. `waited_s`: time already spent upstream."""
        batch, round_s = outlook.batch, outlook.round_s
        left_s = self.timeout_s - waited_s
        if left_s <= 0:
            return Refusal(504, f"waited {waited_s:.2f} s before reaching the model, past its {self.timeout_s:g} s "
                                f"deadline", 1)
        if queued >= self.max_queue:
            drain_s = answer_in_s(queued - self.max_queue, 0.0, batch, round_s or 0.0)
            return Refusal(503, f"too many requests waiting ({queued}, the limit); try again later",
                           retry_after(drain_s))
        if not self.by_prediction or round_s is None:
            return None
        predicted_s = answer_in_s(queued, outlook.busy_left_s, batch, round_s)
        if predicted_s <= left_s:
            return None
        return Refusal(503, f"would be answered in {predicted_s:.2f} s, past its {left_s:.2f} s left "
                            f"({queued} queued, {round_s * 1e3:.0f} ms a batch of {batch}); try again later",
                       retry_after(predicted_s - left_s), late=True)


def upstream_queue(timeout_s: float, round_s: float, batch: int, max_queue: int) -> int:
    """How many requests a FIFO queue ahead of the pool (TorchServe's job queue) may hold so that
    its last is answered within the deadline, batches taking `round_s`: it waits for the running
    batch and its queue's rounds, B × (floor(timeout / round) − 1); at least one batch (so the
    instances never wait for work), at most `max_queue`."""
    rounds = math.floor(timeout_s / round_s) - 1 if round_s > 0 else max_queue
    return max(batch, min(max_queue, batch * rounds))


class ServedRounds:
    """How long a planned batch takes through the pool against the plan's latency for it: the
    ratio served / predicted over the recent sub-batches, each against its share of the planned
    batch's latency (a partial batch runs less efficiently per request, so it errs on the slow
    side: where requests reach the pool slower than it serves, as behind a congested front end,
    the batches are partial and slow both), 1.0, the plan as predicted, until the first is served; and how far single ones
    stray from it. A round is predicted at the ratio plus that deviation, as TCP times a
    retransmission: a request admitted on a round's mean would miss its deadline whenever the
    rounds ahead of it came out a little slower."""

    def __init__(self, smoothing: float = SMOOTHING):
        self.smoothing, self.ratio, self.deviation, self.seen = smoothing, 1.0, 0.0, 0
        self.settling_until = float("-inf")  # a new instance's first batches are not its pace (settle())

    def add(self, measured_s: float, requests: int, planned_batch: int, expected_s: float | None,
            now: float = float("inf")) -> None:
        """One sub-batch of `requests` answered `measured_s` after it was handed out (at `now`); its
        instance plans `planned_batch` in `expected_s` (None: unknown, and the ratio is then the
        planned share's time itself, in seconds)."""
        if requests <= 0 or measured_s <= 0 or now < self.settling_until:
            return
        sample = measured_s * planned_batch / requests / (expected_s or 1.0)  # the planned share at its pace
        if self.seen:
            self.deviation = self._mix(self.deviation, abs(sample - self.ratio))
            self.ratio = self._mix(self.ratio, sample)
        else:
            self.ratio = sample
        self.seen += 1

    def _mix(self, old: float, new: float) -> float:
        return (1 - self.smoothing) * old + self.smoothing * new

    def settle(self, until: float) -> None:
        """Leave out what is answered until then (a switch, a lost instance): the rounds keep the
        pace they had, not the first batches of instances that just started."""
        self.settling_until = max(self.settling_until, until)

    @property
    def margin_ratio(self) -> float:
        """The ratio a round is predicted at: the mean and one deviation."""
        return self.ratio + self.deviation

    def round_s(self, expected_s: list[float | None]) -> float | None:
        """A round of the plan: its slowest instance's predicted latency, as served."""
        known = [e for e in expected_s if e]
        if known and len(known) == len(expected_s):
            return max(known) * self.margin_ratio
        return self.margin_ratio if self.seen else None


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
    batch that may have been on its way to the worker as pending too. And a batch that came
    later than TorchServe's batch delay (`delay_s`) after the worker's last answer found the queue
    empty then: its first request was taken as it arrived, and sent at most the delay later."""

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

    def arrived(self, now: float, size: int) -> float:
        """A batch of `size` arrived at `now`: the most its requests can have waited upstream."""
        waited = self._by_rounds(now)
        idle_since = self.answered_at if self.holding_since is None else None
        if idle_since is not None and now - idle_since > self.delay_s + IDLE_SLACK_S:
            waited = min(waited, self.delay_s + IDLE_SLACK_S)  # the queue was empty at the last answer
        for at, queued_up_to in reversed(list(self.looks)):  # a copy: looks come from another thread
            if queued_up_to <= self.taken:  # this batch was not yet queued at that look
                waited = min(waited, now - at)
                break
        self.rounds.append((now, size))
        self.taken += size
        self.holding_since = now
        return waited

    def _by_rounds(self, now: float) -> float:
        taken = 0
        for at, count in reversed(self.rounds):
            left = 0 if count < self.full else self.capacity - count
            if left <= taken:
                return now - at
            taken += count
        return now - self.rounds[0][0] if self.rounds else 0.0
