"""The load a member reports to the node: arrivals, and how much of the time it had requests in
hand, over a sliding window."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

# A pool with requests in hand this share of the time is planned as a closed loop (saturated, with its
# time away measured: ModelLoad.away_ms); below it, as an open load at its arrival rate. At 0.85,
# SqueezeNet at 4 users alone on a core (in hand 75 % of the time, 13 ms of its 53 ms period away)
# read as an open 75 req/s, was planned into turns on both cores as such, and its closed loop fell
# to 23 req/s (issue 33, third session); a closed loop with its time away covers both cases.
BUSY_SATURATED = 0.5
LOAD_WINDOW_S = 10.0
# A closed loop's time away is reported as the least of the windows over this long: away measured
# while the model's cores (and so its front end) are starved is not the loop's own think time.
AWAY_MEMORY_S = 60.0


@dataclass
class LoadMeter:
    """Arrivals and requests in hand over a sliding window. A sample says whether the pool had
    requests in hand: queued, running, or waiting for another model's turn on its cores. A pool
    that has some most of the time (BUSY_SATURATED) takes whatever it gets (a closed loop, a
    backlog): saturated; else its load is its arrivals. The wait for a turn counts: issue 33 first left it out, and a closed
    loop held back by turns then read as light: ResNet-50 at 4 users, in turns with BERT on one
    core, ran 60 % of the time and read as 7 req/s, so the owner moved all three models into
    turns on both cores and SqueezeNet's batches, alone on a core until then, waited 0 → 130 ms
    each for their turn (BENCHMARKS.md). The watchdog still leaves a waiting batch alone."""

    window_s: float = LOAD_WINDOW_S
    clock: Callable[[], float] = time.monotonic
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    busy: list[tuple[float, bool]] = field(default_factory=list)
    aways: list[tuple[float, float]] = field(default_factory=list)  # (when, a window's time away a batch, ms)
    started: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def arrive(self, count: int) -> None:
        self.arrivals.append((self.clock(), count))

    def sample(self, in_hand: int) -> None:
        self.busy.append((self.clock(), in_hand > 0))

    def rate(self) -> float | None:
        """Requests a second, 0 when idle, None when saturated (requests in hand nearly all the window)."""
        arrivals = self.arrival_rate()
        return None if self.in_hand_share() >= BUSY_SATURATED else arrivals

    def arrival_rate(self) -> float:
        """Requests a second that came in over the window, saturated or not."""
        now = self.clock()
        self.arrivals = [a for a in self.arrivals if a[0] > now - self.window_s]
        span = min(self.window_s, max(now - self.started, 1e-3))
        return sum(n for _, n in self.arrivals) / span

    def in_hand_share(self) -> float:
        """The share of the window's samples with requests in hand (0 before the first)."""
        now = self.clock()
        self.busy = [b for b in self.busy if b[0] > now - self.window_s]
        return sum(b for _, b in self.busy) / len(self.busy) if self.busy else 0.0

    def served_overheads(self, stage_ms: dict, requests_per_sub_batch: float, batch: int) -> dict:
        """What the model's served batches spend beyond the profile's model time, for the node
        planner (ModelLoad): `request_ms`, one request's work inside its turn (decoding, encoding:
        the instance holds its cores from the "locks" stage on), and `away_ms`, the part of a batch's
        period (`batch` requests at the arrival rate) with no request in hand: for a closed loop,
        the time its next batch spends with the clients and the server's front end, when it does
        not ask for its cores (the planner's asking share); the least over AWAY_MEMORY_S, as a
        starved front end reads longer: SqueezeNet at 4 users spent 10 ms of each batch away alone
        on a core and 95–122 ms in turns on a core that ran model work without a break (issue 33).
        Empty until the pool has served."""
        if not stage_ms or requests_per_sub_batch <= 0:
            return {}
        inside = stage_ms.get("decode", 0.0) + stage_ms.get("encode", 0.0)
        overheads = {"request_ms": inside / requests_per_sub_batch}
        arrivals, now = self.arrival_rate(), self.clock()
        if arrivals > 0:
            self.aways.append((now, (1 - self.in_hand_share()) * 1e3 * batch / arrivals))
        self.aways = [a for a in self.aways if a[0] > now - AWAY_MEMORY_S]
        if self.aways:
            overheads["away_ms"] = min(away for _, away in self.aways)
        return overheads
