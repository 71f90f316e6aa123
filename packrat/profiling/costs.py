"""What measuring a profile point costs, in seconds of wall time. Pure: numbers in, numbers out.

One model serves the search (a point's predicted cost at its fitted latency: value per second) and
replays (their simulated clock, at the recorded latency), so a budget replays as it would run.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# A point's figure is known as well as the plans need once the 95 % interval of its mean is within
# this share of it: the search's tolerance, so two points a tolerance apart are rarely swapped.
DEFAULT_PRECISION = 0.02
MIN_RUNS = 3
MIN_PRECISE_RUNS = 5  # the precision rule trusts a spread from 5 runs: 3 close ones by chance stopped a point 8 % off
SERVED_WARMUP = 2  # untimed served runs of a point (point.SERVED_WARMUP)
# What the search expects a run's noise to be before it has measured any (4 % on a quiet VM).
EXPECTED_NOISE = 0.04
# A worker group's start and load, and an AOT package on one core (docs/benchmarks/profiles.md).
DEFAULT_LOAD_S = 2.0
DEFAULT_BUILD_S = 40.0


# Student's t at 97.5 % by degrees of freedom: a spread from 3 runs is itself uncertain.
_T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}


def enough_runs(samples: list[float], elapsed_s: float, min_time: float | None, max_runs: int | None,
                precision: float | None = DEFAULT_PRECISION) -> bool:
    """Whether a point's timed runs can stop: at least MIN_RUNS, then once `min_time` has passed or
    `max_runs` are done, or from MIN_PRECISE_RUNS once the 95 % interval of their mean is within
    `precision` of it."""
    n = len(samples)
    if n < MIN_RUNS:
        return False
    if min_time is not None and elapsed_s >= min_time or max_runs is not None and n >= max_runs:
        return True
    if precision is None or n < MIN_PRECISE_RUNS:
        return False
    half_width = _T975.get(n - 1, 1.96 + 2.5 / n) * statistics.stdev(samples) / math.sqrt(n)
    return half_width <= precision * statistics.fmean(samples)


@dataclass(frozen=True)
class Costs:
    """The cost model of measuring: the timing rules of ProfileSettings and the fixed costs."""
    warmup: int = 3  # untimed runs of a worker's first point (later points: one, for the new shapes)
    min_time: float | None = 1.0
    max_runs: int | None = 30
    iters: int | None = None
    served: bool = True
    precision: float | None = DEFAULT_PRECISION
    load_s: float = DEFAULT_LOAD_S  # starting and loading one worker group
    build_s: float = DEFAULT_BUILD_S  # one package, on one core

    def expected_runs(self, ms: float, noise: float = EXPECTED_NOISE) -> int:
        """The timed runs the rules take at `ms` a run with relative noise `noise`: the precision
        reached, the min-time passed or the most runs, whichever comes first."""
        if self.iters is not None:
            return self.iters
        by_time = math.ceil(self.min_time * 1e3 / ms) if self.min_time is not None else math.inf
        by_precision = math.ceil((1.96 * noise / self.precision) ** 2) if self.precision else math.inf
        return max(MIN_RUNS, min(by_time, max(MIN_PRECISE_RUNS, by_precision), self.max_runs or math.inf))

    def point_s(self, ms: float, served_ms: float | None = None, *, first: bool, copies: int,
                runs: int | None = None, served_runs: int | None = None) -> float:
        """One point's wall time: its warm-up, an untimed lockstep round with copies, its timed runs
        (`runs`, else expected), and with served figures their warm-up and runs as long again."""
        served_ms = served_ms or ms
        warm = (self.warmup if first else 1) + (copies > 1)
        model = ms * (warm + (runs if runs is not None else self.expected_runs(ms)))
        if not self.served:
            return model / 1e3
        served = served_ms * (SERVED_WARMUP + (served_runs if served_runs is not None
                                               else self.expected_runs(served_ms)))
        return (model + served) / 1e3

    def builds_s(self, packages: int, cores: int) -> float:
        """Building `packages` side by side, one a core at a time: waves of build_s."""
        return math.ceil(packages / max(1, cores)) * self.build_s if packages else 0.0
