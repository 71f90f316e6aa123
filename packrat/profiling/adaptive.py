"""Adaptive profiling: measure only the points ⟨t, b⟩ that can still change a plan.

A full profile measures every thread count t = 1..T at every batch size b. The planner only
ever uses some of them: a point slower than the same batch on fewer threads is never chosen,
and at large batches splitting beats most single instances. This module decides, point by
point, which measurements are still needed. It is pure (numbers in, numbers out); the profiler
measures (`packrat profile --adaptive`) or looks points up in a full table (`--replay`).

The method. Keep the measured points and, for every unmeasured one, a lower bound on its latency
derived from them (below). Two tables of plan latencies for every T ≤ max(threads), B ≤ max_batch:
    best[T, B]   the planner's optimum over the measured points only (what the profile gives);
    bound[T, B]  the optimum if every unmeasured point were as fast as its lower bound.
bound ≤ best. Where bound < best, the optimistic plan for that (T, B) uses an unmeasured point
that might beat today's plan: measure one of them (the fewest threads first, since bounds come
from points with fewer threads). Stop when bound ≥ best / (1 + tolerance) for every (T, B): then
no unmeasured point can improve any plan (by more than `tolerance`), and the measured points
give every plan the full grid gives. With tolerance 0 that is exact, under these assumptions:

For every batch size b, with a slack s (5 % by default) for measurement noise:
  A1. Latency grows with the batch: L(t, b) ≥ L(t, b') / (1 + s) for b' < b, when ⟨t, b'⟩ is a record.
  A2. Scaling is at most linear from a record, a point faster than every measured point with
      fewer threads at its batch size: L(t, b) ≥ (t'/t) · L(t', b) / (1 + s) for t > t'.
  A3. Returns diminish across doublings: the throughput 1/L rises from the record with the
      most threads that is a power of two no faster than along the chord from the record at
      half its threads (chords span doublings so that a thread count that splits the work
      badly, like the odd counts of some transformer tables, cannot flatten them).
A point slower than a record with fewer threads ("more threads are slower") may appear anywhere:
it is no record, bounds nothing, and the planner never needs it.

Self-check. A measured point faster than its own bound shows the assumptions failing at that
batch size. That batch size and its two neighbours then use only a weaker bound:
  A4. A run on t threads can be emulated on t' < t threads, each running ⌈t/t'⌉ of its shares:
      L(t, b) ≥ L(t', b) / ⌈t/t'⌉ / (1 + s) for a record t'.
The seed measures the fewest threads at every batch size, so every batch the full grid can
cover, the measured points cover. Replays of the published 16-core tables and of generated
ones check the whole (tests/test_adaptive.py; BENCHMARKS.md, issue 10).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from packrat.planning.planner import Item, Planner

Point = tuple[int, int]  # (threads, batch)
DEFAULT_SLACK = 0.05
_EPSILON = 1e-12  # float noise in plan comparisons


@dataclass
class AdaptiveGrid:
    """Which points of threads × batches to measure so that every plan for T ≤ max(threads)
    and B ≤ max_batch (default: the largest batch size) is the full grid's plan."""

    threads: list[int]
    batches: list[int]
    slack: float = DEFAULT_SLACK
    tolerance: float = 0.0
    max_batch: int | None = None
    latency: np.ndarray = field(init=False, repr=False)  # [thread index, batch index]; NaN: unmeasured
    irregular: np.ndarray = field(init=False, repr=False)  # per batch size: the self-check failed near it

    def __post_init__(self) -> None:
        self.threads = sorted(set(self.threads))
        self.batches = sorted(set(self.batches))
        if not self.threads or not self.batches or self.threads[0] < 1 or self.batches[0] < 1:
            raise ValueError("threads and batches must be non-empty lists of integers >= 1")
        if self.slack < 0 or self.tolerance < 0:
            raise ValueError("slack and tolerance must be >= 0")
        self.max_batch = self.max_batch or self.batches[-1]
        self.latency = np.full((len(self.threads), len(self.batches)), np.nan)
        self.irregular = np.zeros(len(self.batches), dtype=bool)

    # ---- the points ----------------------------------------------------------------------------

    @property
    def grid_size(self) -> int:
        return self.latency.size

    @property
    def measured(self) -> dict[Point, float]:
        return {(self.threads[i], self.batches[j]): float(self.latency[i, j])
                for i, j in zip(*np.nonzero(~np.isnan(self.latency)))}

    def _index(self, threads: int, batch: int) -> tuple[int, int]:
        return self.threads.index(threads), self.batches.index(batch)

    def record(self, threads: int, batch: int, latency_ms: float) -> None:
        """Add a measured point (the self-check runs here)."""
        if not latency_ms > 0:
            raise ValueError(f"latency must be > 0, got {latency_ms} for threads={threads} batch={batch}")
        i, j = self._index(threads, batch)
        if np.isnan(self.latency[i, j]) and latency_ms < self.lower_bounds()[i, j]:
            self.irregular[max(0, j - 1): j + 2] = True
        self.latency[i, j] = latency_ms

    # ---- bounds --------------------------------------------------------------------------------

    def lower_bounds(self) -> np.ndarray:
        """Each point's latency where measured, else its lower bound under A1-A4."""
        low = np.column_stack([self._column_bounds(self.latency[:, j], self.irregular[j])
                               for j in range(len(self.batches))])
        # A1, carried up the batch sizes from records and bounds (never from a slower point).
        carry = np.zeros(len(self.threads))
        for j in range(len(self.batches)):
            unmeasured = np.isnan(self.latency[:, j])
            low[unmeasured, j] = np.maximum(low[unmeasured, j], carry[unmeasured])
            source = low[:, j].copy()
            source[_slower(self.latency[:, j])] = 0.0
            carry = np.maximum(carry, source) / (1 + self.slack)
        return low

    def _column_bounds(self, column: np.ndarray, irregular: bool) -> np.ndarray:
        """Bounds within one batch size, from its records (A2, A3; A4 when irregular)."""
        records = _records(column)
        low = np.where(np.isnan(column), 0.0, column)
        for i in np.nonzero(np.isnan(column))[0]:
            below = [k for k in records if k < i]
            if not below:
                continue
            t = self.threads[i]
            if irregular:
                rate = min(math.ceil(t / self.threads[k]) / column[k] for k in below)  # A4
            else:
                rate = min(t / self.threads[k] / column[k] for k in below)  # A2
                rate = min(rate, self._chord_rate(column, below, t))  # A3
            low[i] = 1.0 / rate / (1 + self.slack)
        return low

    def _chord_rate(self, column: np.ndarray, below: list[int], t: int) -> float:
        """A3: the throughput at t along the chord of the last doubling among the records below."""
        doubled = [k for k in below if _power_of_two(self.threads[k])
                   and self.threads[k] // 2 in self.threads
                   and self.threads.index(self.threads[k] // 2) in below]
        if not doubled:
            return math.inf
        high = doubled[-1]
        low = self.threads.index(self.threads[high] // 2)
        slope = (1 / column[high] - 1 / column[low]) / (self.threads[high] - self.threads[low])
        return 1 / column[high] + max(slope, 0.0) * (t - self.threads[high])

    # ---- the decision --------------------------------------------------------------------------

    def _items(self, values: np.ndarray, mask: np.ndarray) -> list[Item]:
        return [(self.threads[i], self.batches[j], float(values[i, j])) for i, j in zip(*np.nonzero(mask))]

    def gaps(self) -> tuple[np.ndarray, Planner]:
        """best / bound for every (T, B) (1 where nothing can change), and the optimistic planner."""
        measured = ~np.isnan(self.latency)
        best = Planner(self._items(self.latency, measured), self.threads[-1], self.max_batch).table
        optimistic = Planner(self._items(self.lower_bounds(), np.ones_like(measured)),
                             self.threads[-1], self.max_batch)
        with np.errstate(invalid="ignore", divide="ignore"):
            gap = best / optimistic.table
        gap[np.isnan(gap)] = 1.0  # B = 0, or no plan either way
        return gap, optimistic

    def next_point(self) -> Point | None:
        """The next point to measure, or None when no unmeasured point can change a plan."""
        first = [(self.threads[0], b) for j, b in enumerate(self.batches) if np.isnan(self.latency[0, j])]
        if first:  # the seed: coverage, and the records every bound starts from
            return first[0]
        gap, optimistic = self.gaps()
        open_rows = np.nonzero(gap.max(axis=1) > 1 + self.tolerance + _EPSILON)[0]
        if not len(open_rows):
            return None
        threads = int(open_rows[0])  # fewest threads first: bounds come from below
        batch = int(np.argmax(gap[threads]))
        plan = optimistic.plan(threads, batch)
        unmeasured = [(i.threads, i.batch) for i in plan.instances if np.isnan(self.latency[self._index(i.threads, i.batch)])]
        return min(unmeasured)


def _records(column: np.ndarray) -> list[int]:
    """Indices of measured points faster than every measured point with fewer threads."""
    records, fastest = [], math.inf
    for i, value in enumerate(column):
        if not np.isnan(value) and value < fastest:
            records.append(i)
            fastest = value
    return records


def _slower(column: np.ndarray) -> np.ndarray:
    """Mask of measured points that are no record (slower than a point with fewer threads)."""
    mask = ~np.isnan(column)
    mask[_records(column)] = False
    return mask


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def run(grid: AdaptiveGrid, measure: Callable[[int, int], float],
        on_point: Callable[[int, int, float], None] | None = None) -> dict[Point, float]:
    """Measure the points `grid` asks for until no plan can change; returns the measured points.
    `measure(t, b)` gives a latency in ms; `on_point(t, b, ms)` hears of each (progress, files)."""
    while (point := grid.next_point()) is not None:
        latency = measure(*point)
        grid.record(*point, latency)
        if on_point:
            on_point(*point, latency)
    return grid.measured


def run_together(grids: dict[str, AdaptiveGrid], measure: Callable[[str, int, int], float],
                 on_point: Callable[[str, int, int, float], None] | None = None,
                 measured_all: Callable[[int, int], Iterable[str]] | None = None) -> None:
    """Several runtimes' grids over the same threads × batches, measured back to back: the point
    any grid asks for next (the smallest, when several ask) is measured under every runtime whose grid
    lacks it, one right after the other, so that a machine drifting over minutes does not decide
    which runtime is faster at it. A grid may so get points it would not have asked for; each grid
    still stops only when no unmeasured point can change its plans. `measure(name, t, b)` gives a
    latency in ms; `on_point(name, t, b, ms)` hears of each; `measured_all(t, b)`, once a point is
    measured under every runtime, names the runtimes to measure no further (their grids are left)."""
    grids = dict(grids)
    while True:
        asked = [point for point in (grid.next_point() for grid in grids.values()) if point is not None]
        if not asked:
            return
        point = min(asked)
        for name, grid in grids.items():
            if point not in grid.measured:
                latency = measure(name, *point)
                grid.record(*point, latency)
                if on_point:
                    on_point(name, *point, latency)
        for name in measured_all(*point) if measured_all else ():
            grids.pop(name, None)


def resume(grid: AdaptiveGrid, points: Iterable[tuple[int, int, float]]) -> None:
    """Record points measured earlier (an interrupted run's file) that lie on the grid."""
    for t, b, latency in points:
        if t in grid.threads and b in grid.batches:
            grid.record(t, b, latency)
