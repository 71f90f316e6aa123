"""The load a member reports to the node: arrivals and working time over a sliding window."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

BUSY_SATURATED = 0.85  # a pool working this share of the time takes whatever it gets: saturated
LOAD_WINDOW_S = 10.0


@dataclass
class LoadMeter:
    """Arrivals and working time over a sliding window. A sample says whether the pool was working:
    running a batch on cores it holds. Waiting for another model's turn is not work (else a light
    model queued behind a heavy one would look saturated and be given more than it needs)."""

    window_s: float = LOAD_WINDOW_S
    clock: Callable[[], float] = time.monotonic
    arrivals: list[tuple[float, int]] = field(default_factory=list)
    busy: list[tuple[float, bool]] = field(default_factory=list)
    started: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def arrive(self, count: int) -> None:
        self.arrivals.append((self.clock(), count))

    def sample(self, working: int) -> None:
        self.busy.append((self.clock(), working > 0))

    def rate(self) -> float | None:
        """Requests a second, 0 when idle, None when saturated (working nearly all the window)."""
        now = self.clock()
        self.arrivals = [a for a in self.arrivals if a[0] > now - self.window_s]
        self.busy = [b for b in self.busy if b[0] > now - self.window_s]
        span = min(self.window_s, max(now - self.started, 1e-3))
        if self.busy and sum(b for _, b in self.busy) / len(self.busy) >= BUSY_SATURATED:
            return None
        return sum(n for _, n in self.arrivals) / span
