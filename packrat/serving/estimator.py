"""Batch-size estimator: which batch size B the plan should be made for, from the load the
handler sees (the requests in the pool when each one arrives). Pure: numbers in, numbers out.

Every observation feeds an exponentially weighted moving average (weight α for
the newest). Once per period the average is rounded to the nearest power of two on a log scale (capped at
the configured batch size) and appended to the last `window` estimates; the most common
of those is the target. A new target is proposed only when it differs from the current
one and holds a strict majority of the window, and going down needs the average to fall
clearly (15 %) below the current target, so one noisy second, an average hovering at a
power-of-two boundary, or a load oscillating faster than the window does not flap the plan. A full batch (the configured size) means requests are queueing behind it, so
the demand is at least that: it counts as the configured size, which the cap allows
as a target even when it is not a power of two.
"""

from __future__ import annotations

from collections import Counter, deque
from itertools import islice

from packrat.settings import EstimatorSettings  # its fields, defaults and checks: the packrat: schema's

PEAK_WINDOW_S = 0.5  # observations this recent make the peak the average takes (a wave of a closed loop)


def floor_power_of_two(value: float) -> int:
    """The largest power of two ≤ value (1 for anything below 2)."""
    power = 1
    while power * 2 <= value:
        power *= 2
    return power


def nearest_power_of_two(value: float) -> int:
    """The power of two nearest to value on a log scale: between p and 2p the boundary is p·√2."""
    power = floor_power_of_two(value)
    return power * 2 if value * value >= 2 * power * power else power


class BatchSizeEstimator:
    def __init__(self, current: int, max_batch: int, settings: EstimatorSettings = EstimatorSettings()):
        if not 1 <= current <= max_batch:
            raise ValueError(f"current batch {current} must be in 1..{max_batch}")
        self.current, self.max_batch, self.settings = current, max_batch, settings
        self.average: float | None = None
        self._recent: deque[tuple[float | None, int]] = deque(maxlen=max_batch)  # (when, size): for the peak
        self.estimates: deque[int] = deque(maxlen=settings.window)
        self._next_check: float | None = None

    def observe(self, size: int, now: float | None = None) -> None:
        """One batch of `size` requests arrived (with those already in the pool). What the average
        takes is the largest of the last `current` observations: a closed loop of U users whose
        answers come back together sends its next requests one by one, seen as 1, 2, ..., U, whose
        mean (U + 1) / 2 would pull the target down to a plan whose staggered answers are then seen
        as about U, and up again: ResNet-50 under 4 users, submitted one by one, went between
        B = 4 and B = 2 every 6-13 s, 23 switches in 180 s (BENCHMARKS.md, issue 42). A front end
        that hands over whole batches (TorchServe) sees each batch at once and is not changed.
        `now` (the clock check() reads): observations older than PEAK_WINDOW_S are no part of the
        peak, so a load that drops is seen within that time, however sparse its requests."""
        size = min(max(size, 1), self.max_batch)
        while now is not None and self._recent and self._recent[0][0] < now - PEAK_WINDOW_S:
            self._recent.popleft()
        self._recent.append((now, size))
        size = max(seen for _, seen in islice(reversed(self._recent), self.current))
        alpha = self.settings.alpha
        self.average = size if self.average is None else alpha * size + (1 - alpha) * self.average

    def estimate(self) -> int | None:
        """The average as a plan size: a power of two, or the configured size when it reaches it."""
        if self.average is None:
            return None
        if self.average >= self.max_batch - 0.5:  # essentially every batch full: a queue behind it
            return self.max_batch
        # Nearest on a log scale, not rounded down: a closed loop of U users averages below U
        # (requests in transit are not in the pool), more so on a loaded machine.
        estimate = min(nearest_power_of_two(self.average), self.max_batch)
        if estimate < self.current and self.average >= self.current * (1 - self.settings.hysteresis):
            return self.current  # just under the current target's boundary: noise, not a new load
        return estimate

    def check(self, now: float) -> int | None:
        """Call as often as convenient; acts once per period. Returns a new target batch
        size when a strict majority of the recent estimates differs from the current one."""
        if self._next_check is None:
            self._next_check = now + self.settings.period_s
            return None
        if now < self._next_check:
            return None
        self._next_check = now + self.settings.period_s
        estimate = self.estimate()
        if estimate is None:
            return None
        self.estimates.append(estimate)
        target = self._most_common()
        if target == self.current:
            return None
        self.current = target
        return target

    def _most_common(self) -> int:
        """The estimate holding a strict majority of the window, else the current target."""
        estimate, count = Counter(self.estimates).most_common(1)[0]
        return estimate if count > self.settings.window // 2 else self.current
