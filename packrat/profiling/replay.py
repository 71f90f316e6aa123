"""A replay: `packrat profile --replay FILE` looks each point up in a recorded table on a simulated
clock that charges what measuring it would cost (costs.py), so the search and its budget are checked
on a machine one does not have. Each run is the recorded figure times lognormal noise, seeded by
the point, and the runs stop by costs.enough_runs as real ones do.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from packrat.errors import ProfilingError
from packrat.machine.topology import Topology
from packrat.profiling import profiles
from packrat.profiling.costs import Costs
from packrat.profiling.measuring import ProfileSettings, copies_for
from packrat.profiling.point import summarize

DEFAULT_NOISE = 0.0  # a replay looks the table up as it is unless --noise says otherwise


@dataclass
class SimulatedClock:
    """Seconds charged so far: the Account's clock in a replay."""
    now_s: float = 0.0

    def __call__(self) -> float:
        return self.now_s

    def charge(self, seconds: float) -> None:
        self.now_s += seconds


@dataclass(frozen=True)
class Replay:
    """What a replay looks up and how it charges the clock."""
    source: profiles.Profile
    clock: SimulatedClock
    costs: Costs
    noise: float = DEFAULT_NOISE
    seed: int = 0

    def workers(self, settings: ProfileSettings, threads: int, topology: Topology) -> "ReplayedWorkers":
        """A worker group of settings.runtime on `threads`, started on the simulated clock."""
        return ReplayedWorkers(self, settings.runtime, threads, copies_for(settings, threads, topology))

    def build(self, packages: int, cores: int) -> float:
        """Charge `packages` builds, side by side a core each; the seconds charged."""
        seconds = self.costs.builds_s(packages, cores)
        self.clock.charge(seconds)
        return seconds

    def runs(self, key: tuple, ms: float) -> list[float]:
        """The runs of one figure drawn around `ms` until the stopping rule ends them."""
        rng = np.random.default_rng([self.seed, zlib.crc32(repr(key).encode())])
        if self.costs.iters is not None:
            return list(ms * np.exp(rng.normal(0.0, self.noise, self.costs.iters)))
        from packrat.profiling.costs import enough_runs

        samples: list[float] = []
        while not enough_runs(samples, sum(samples) / 1e3, self.costs.min_time, self.costs.max_runs,
                              self.costs.precision):
            samples.append(ms * math.exp(rng.normal(0.0, self.noise)))
        return samples


class ReplayedWorkers:
    """Workers (measuring.py) of one (runtime, threads) in a replay: their start and each point
    charged to the simulated clock, each point's row drawn from the recorded table."""

    def __init__(self, replay: Replay, runtime: str, threads: int, copies: int):
        self.replay, self.runtime, self.threads, self.copies = replay, runtime, threads, copies
        self.load_s, self.measure_s, self.first = replay.costs.load_s, 0.0, True
        replay.clock.charge(self.load_s)

    def measure(self, batch: int) -> dict:
        points = self.replay.source.by_runtime.get(self.runtime, {})
        if (self.threads, batch) not in points:
            raise ProfilingError(f"the replayed profile has no point threads={self.threads} batch={batch} "
                                 f"({self.runtime})")
        latency, isolated = points[self.threads, batch]
        served = self.replay.source.served.get(self.runtime, {}).get((self.threads, batch))
        key = (self.runtime, self.threads, batch)
        model_runs = self.replay.runs((*key, "model"), latency)
        row = {"threads": self.threads, "batch": batch, "runtime": self.runtime, "copies": self.copies,
               **summarize(model_runs), "isolated_ms": isolated}
        served_runs = self.replay.runs((*key, "served"), served[0]) if served and self.replay.costs.served else []
        if served_runs:
            stats = summarize(served_runs)
            row.update(served_ms=stats["latency_ms"], served_mad_ms=stats["mad_ms"], served_std_ms=stats["std_ms"],
                       served_isolated_ms=served[1])
        seconds = self.replay.costs.point_s(latency, served[0] if served else None, first=self.first,
                                            copies=self.copies, runs=len(model_runs),
                                            served_runs=len(served_runs) or None)
        self.replay.clock.charge(seconds)
        self.measure_s += seconds
        self.first = False
        return row

    def close(self, ok: bool = True) -> None:
        pass
