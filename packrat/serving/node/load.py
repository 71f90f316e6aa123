"""The load a member reports to the node: arrivals, and how much of the time it had requests in
hand, over a sliding window."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

BUSY_SATURATED = 0.85  # a pool with requests in hand this share of the time takes whatever it gets: saturated
# ... and so does one whose batches mostly come full: the front end's queue (TorchServe's) held
# requests while the pool had none in hand, so the busy share alone read a closed loop as light
FULL_SATURATED = 0.5
FULL_MIN_BATCHES = 8  # batches in the window before their fullness says anything
LOAD_WINDOW_S = 10.0


@dataclass
class LoadMeter:
    """Arrivals and requests in hand over a sliding window. A sample says whether the pool had
    requests in hand: queued, running, or waiting for another model's turn on its cores. A pool
    that always has some takes whatever it gets (a closed loop, a backlog): saturated; else its
    load is its arrivals. The wait for a turn counts: issue 33 first left it out, and a closed
    loop held back by turns then read as light: ResNet-50 at 4 users, in turns with BERT on one
    core, ran 60 % of the time and read as 7 req/s, so the owner moved all three models into
    turns on both cores and SqueezeNet's batches, alone on a core until then, waited 0 → 130 ms
    each for their turn (BENCHMARKS.md). The watchdog still leaves a waiting batch alone.

    Requests waiting in the front end's own queue (TorchServe's, while the batch before runs) are
    not in hand, so a batch that arrives full counts too: ResNet-50 and SqueezeNet in one
    TorchServe, B = 4, 4 closed-loop users each, read 14.8 and 27 req/s, both light, were put in
    turns on both cores, and SqueezeNet served 0.25 of what it serves alone (2026-12-02)."""

    window_s: float = LOAD_WINDOW_S
    clock: Callable[[], float] = time.monotonic
    arrivals: list[tuple[float, int, bool]] = field(default_factory=list)  # (when, requests, a full batch)
    busy: list[tuple[float, bool]] = field(default_factory=list)
    started: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def arrive(self, count: int, full: bool = False) -> None:
        """`count` requests arrived together; `full`: as a batch of the front end's largest size."""
        self.arrivals.append((self.clock(), count, full))

    def sample(self, in_hand: int) -> None:
        self.busy.append((self.clock(), in_hand > 0))

    def rate(self) -> float | None:
        """Requests a second, 0 when idle, None when saturated (requests in hand nearly all the
        window, or most of its batches full)."""
        now = self.clock()
        self.arrivals = [a for a in self.arrivals if a[0] > now - self.window_s]
        self.busy = [b for b in self.busy if b[0] > now - self.window_s]
        span = min(self.window_s, max(now - self.started, 1e-3))
        if self.busy and sum(b for _, b in self.busy) / len(self.busy) >= BUSY_SATURATED:
            return None
        if len(self.arrivals) >= FULL_MIN_BATCHES and \
                sum(full for *_, full in self.arrivals) / len(self.arrivals) >= FULL_SATURATED:
            return None
        return sum(n for _, n, _ in self.arrivals) / span
