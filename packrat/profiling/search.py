"""Which points of a profile to measure: those a plan depends on. Pure: figures in, points out.

Designed points per runtime, a fitted scaling model (Ernest, NSDI'16), and at every batch B the plan
from the measured points (best) against the plan hoping each unmeasured point is `confidence` fit
errors faster than predicted (hopeful): where hopeful beats best by more than `tolerance`, its
unmeasured instances are wanted. docs/profiling.md ("The search") gives the rules at length.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from packrat.planning.planner import Planner

Key = tuple[str, int, int]  # (runtime, threads, batch)
DEFAULT_TOLERANCE = 0.02  # a plan this close to the best possible is the plan: the machine's noise is larger
DEFAULT_CONFIDENCE = 2.5  # how many of the fit's errors below its prediction an unmeasured point may be
ERROR_FLOOR = 0.03  # the fit's relative error is never taken as smaller: a point's own noise
MONOTONE_SLACK = 0.05  # a larger batch on the same threads is not faster than a measured smaller one, but by noise
RIVAL = 0.10  # another runtime predicted within this of a planned point's figure is measured there too
FIT_POINTS = 5  # the scaling model's terms: a runtime with fewer points has no fit of its own
SLOW = 1.25  # a point this much slower than the fit is an outlier it is not fitted to (odd threads of some models)


def design(threads: list[int], batches: list[int]) -> list[tuple[int, int]]:
    """The first points of every runtime: the fewest, a middle and the most threads, each at the
    smallest and at a middle batch: six that pin the model's five terms, none of them at the largest
    batches (seconds a run on few threads), which the search measures only where a plan needs them."""
    ts, bs = sorted(set(threads)), sorted(set(batches))
    return list(dict.fromkeys((t, b) for b in (bs[0], _middle(bs)) for t in (ts[0], _middle(ts), ts[-1])))


def costly_design(threads: list[int], batches: list[int]) -> list[tuple[int, int]]:
    """The first points of a runtime whose every point costs a build (inductor's AOT packages): two,
    the most threads at the smallest batch and a middle point, which set its level on the shape the
    other runtimes' fits share."""
    ts, bs = sorted(set(threads)), sorted(set(batches))
    return list(dict.fromkeys([(ts[-1], bs[0]), (_middle(ts), _middle(bs))]))


def _middle(values: list[int]) -> int:
    """The value nearest the geometric middle of a sorted list."""
    centre = math.sqrt(values[0] * values[-1])
    return min(values, key=lambda v: (abs(math.log(v / centre)), v))


def _features(t: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(t), b / t, b, t, np.log(t)], axis=-1)


def _fit(points: dict[tuple[int, int], float]) -> np.ndarray:
    """Non-negative coefficients of the scaling model, least squares on relative error."""
    t, b = (np.array(axis, dtype=float) for axis in zip(*points))
    y = np.array(list(points.values()))
    x = _features(t, b) / y[:, None]
    active = np.ones(x.shape[1], dtype=bool)
    while True:  # drop a negative term and fit again: at most five times
        theta = np.zeros(x.shape[1])
        theta[active] = np.linalg.lstsq(x[:, active], np.ones(len(y)), rcond=None)[0]
        if (theta >= 0).all() or active.sum() == 1:
            return np.maximum(theta, 0)
        active[np.argmin(theta)] = False


@dataclass
class Search:
    """The search over `threads` × `batches` under `runtimes`, for plans on `cores` (default: the most
    threads). record() each figure measured; next_points() says what to measure next."""

    threads: list[int]
    batches: list[int]
    runtimes: tuple[str, ...]
    cores: int | None = None
    costly: tuple[str, ...] = ()  # runtimes whose every point costs a build: designed from two points
    tolerance: float = DEFAULT_TOLERANCE
    confidence: float = DEFAULT_CONFIDENCE
    measured: dict[Key, float] = field(default_factory=dict)
    errors: dict[Key, float] = field(default_factory=dict)  # log(measured / predicted before measuring)

    def __post_init__(self) -> None:
        self.threads, self.batches = sorted(set(self.threads)), sorted(set(self.batches))
        self.cores = self.cores or self.threads[-1]
        self._asked = len(self.runtimes)
        self._t, self._b = np.meshgrid(np.array(self.threads, float), np.array(self.batches, float), indexing="ij")

    @property
    def grid_size(self) -> int:
        """Points of the grid under the runtimes asked for (one dropped on a failure still counts)."""
        return len(self.threads) * len(self.batches) * self._asked

    def record(self, runtime: str, threads: int, batch: int, ms: float) -> None:
        """A measured figure; the fit's prediction for it, made before, is kept as its error."""
        if not ms > 0:
            raise ValueError(f"latency must be > 0, got {ms} for {runtime} threads={threads} batch={batch}")
        if self._designed(runtime) and (runtime, threads, batch) not in self.measured:
            predicted = self._predict(runtime)[self.threads.index(threads), self.batches.index(batch)]
            self.errors[runtime, threads, batch] = math.log(ms / predicted)
        self.measured[runtime, threads, batch] = ms

    def _own(self, runtime: str) -> dict[tuple[int, int], float]:
        return {(t, b): ms for (r, t, b), ms in self.measured.items() if r == runtime}

    def _design(self, runtime: str) -> list[tuple[int, int]]:
        borrows = runtime in self.costly and any(r not in self.costly for r in self.runtimes)
        return (costly_design if borrows else design)(self.threads, self.batches)

    def _lenders(self, runtime: str) -> list[str]:
        """The runtimes whose fitted shape a costly one borrows: the others not costly, designed."""
        return [r for r in self.runtimes if r != runtime and r not in self.costly and self._designed(r)]

    def _designed(self, runtime: str) -> bool:
        return set(self._design(runtime)) <= set(self._own(runtime))

    def fit_error(self) -> float:
        """The fit's error on the fast side (a slower point never makes a plan faster): the RMS of the log
        ratios of the points measured after it, those slower than predicted counted as 0; ≥ ERROR_FLOOR."""
        misses = [min(e, 0.0) ** 2 for e in self.errors.values()]
        return max(ERROR_FLOOR, math.sqrt(sum(misses) / len(misses)) if misses else 0.0)

    def _fitted(self, runtime: str) -> tuple[np.ndarray, dict[tuple[int, int], float]]:
        """The runtime's model over the grid, and each of its measured points' miss (log measured /
        model). Fitted to the fast points: one much slower than the fit (SLOW) is never planned."""
        own = self._own(runtime)
        lenders = self._lenders(runtime) if runtime in self.costly and len(own) < 5 else []
        if lenders:
            return self._borrowed(own, lenders)
        theta = _fit(own)
        fast = {p: ms for p, ms in own.items() if ms <= SLOW * _features(*map(np.array, p)) @ theta}
        if len(fast) < len(own) and len(fast) >= 5:
            theta = _fit(fast)
        return _features(self._t, self._b) @ theta, {p: math.log(ms / (_features(*map(np.array, p)) @ theta))
                                                    for p, ms in own.items()}

    def _borrowed(self, own: dict[tuple[int, int], float], lenders: list[str]) -> tuple[np.ndarray, dict]:
        """A costly runtime's model until it has points enough of its own: the geometric mean of the
        other runtimes' fits, at the level its own points set."""
        shape = np.exp(np.mean([np.log(self._fitted(r)[0]) for r in lenders], axis=0))
        at = {p: shape[self.threads.index(p[0]), self.batches.index(p[1])] for p in own}
        level = math.exp(statistics.fmean(math.log(ms / at[p]) for p, ms in own.items()))
        return shape * level, {p: math.log(ms / (at[p] * level)) for p, ms in own.items()}

    def _predict(self, runtime: str) -> np.ndarray:
        """Every point's predicted ms: the runtime's model, moved by what the other runtimes missed by
        there (a bad thread count is slow under all), else by its own nearby fast points' misses."""
        model, misses = self._fitted(runtime)
        fast = {p: miss for p, miss in misses.items() if miss <= math.log(SLOW)}
        t, b = (np.array(axis, dtype=float) for axis in zip(*fast))
        far = (np.log(self._t)[..., None] - np.log(t)) ** 2 + (np.log(self._b)[..., None] - np.log(b)) ** 2
        weight = np.exp(-far / 0.5)
        shift = (weight * np.array(list(fast.values()))).sum(-1) / (weight.sum(-1) + 0.2)
        others: dict[tuple[int, int], list[float]] = {}
        for other in self.runtimes:
            if other != runtime and self._designed(other):
                for point, miss in self._fitted(other)[1].items():
                    others.setdefault(point, []).append(miss)
        for (t, b), found in others.items():
            shift[self.threads.index(t), self.batches.index(b)] = sum(found) / len(found)
        return np.maximum(model * np.exp(shift), 1e-9)

    def _hopeful(self, runtime: str) -> np.ndarray:
        """Every point's figure where measured, else the least it may be: its prediction less
        `confidence` errors, and no less than a measured smaller batch on the same threads allows."""
        low = self._predict(runtime) * math.exp(-self.confidence * self.fit_error())
        own = self._own(runtime)
        for i, t in enumerate(self.threads):
            floor = 0.0
            for j, b in enumerate(self.batches):
                if (t, b) in own:
                    low[i, j] = own[t, b]
                    floor = max(floor, own[t, b] / (1 + MONOTONE_SLACK))
                else:
                    low[i, j] = max(low[i, j], floor)
        return low

    def _planner(self, figures: dict[Key, float]) -> tuple[Planner, dict[tuple[int, int], str]]:
        fastest: dict[tuple[int, int], tuple[float, str]] = {}
        for (runtime, t, b), ms in figures.items():
            fastest[t, b] = min(fastest.get((t, b), (math.inf, "")), (ms, runtime))
        items = [(t, b, ms) for (t, b), (ms, _) in fastest.items() if t <= self.cores]
        return (Planner(items, self.cores, self.batches[-1]),
                {point: runtime for point, (_, runtime) in fastest.items()})

    def next_points(self, cover_only: bool = False) -> list[Key]:
        """What to measure next (wanted()'s points, in its order)."""
        return list(self.wanted(cover_only))

    def wanted(self, cover_only: bool = False) -> dict[Key, float]:
        """What to measure next, each point with its value (summed log(best / hopeful) of the batches
        whose hopeful plan holds it): design points first (inf), else _hoped_for, else the rivals; {}
        when none can change a plan. `cover_only` (a budget spent): only what gives every batch a
        plan, under runtimes designed and, where others are, not costly."""
        designed = [r for r in self.runtimes if self._designed(r)]
        cheap = [r for r in designed if r not in self.costly] or designed
        first = [(r, t, b) for r in self.runtimes for t, b in self._design(r) if (r, t, b) not in self.measured]
        borrowing = [key for key in first if key[0] in self.costly and self._lenders(key[0])]
        first = [key for key in first if key not in borrowing]
        if first and not (cover_only and cheap):
            if cover_only:  # one runtime's design, the cheapest, covers
                runtime = next((r for r, _, _ in first if r not in self.costly), first[0][0])
                first = [key for key in first if key[0] == runtime]
            return dict.fromkeys(first, math.inf)
        wanted: dict[Key, float] = {}
        # The cheap runtimes' hopes too, where a costly one is designed: each batch then gets its best
        # plan without builds, whatever the costly runtime's hopes (on which a budget may end).
        for searched in [cheap] if cover_only or set(cheap) == set(designed) else [designed, cheap]:
            for key, value in self._hoped_for(searched, cover_only).items():
                wanted[key] = max(wanted.get(key, 0.0), value)
        if cover_only:
            return wanted
        # A costly runtime's first points are worth what a rival's are: it may be a few % ahead anywhere.
        wanted.update(dict.fromkeys(borrowing, math.log(1 + RIVAL)))
        return wanted or dict.fromkeys(self._rivals(self._plans(designed)[0]), math.log(1 + self.tolerance))

    def _hoped_for(self, runtimes: list[str], cover_only: bool) -> dict[Key, float]:
        """The unmeasured instances of each hopeful plan over `runtimes` beating the measured plan by
        more than `tolerance` (cover_only: of each batch without a plan, valued 1 a batch)."""
        best, hopeful, runtime_of = self._plans(runtimes)
        wanted: dict[Key, float] = {}
        for batch in self.batches:
            measured, hoped = best.table[self.cores, batch], hopeful.table[self.cores, batch]
            open_batch = not np.isfinite(measured) if cover_only else hoped < measured / (1 + self.tolerance)
            if not open_batch or not np.isfinite(hoped):
                continue
            gain = 1.0 if cover_only else math.log(measured / hoped)
            for instance in hopeful.plan(self.cores, batch).instances:
                key = (runtime_of[instance.threads, instance.batch], instance.threads, instance.batch)
                if key not in self.measured:
                    wanted[key] = wanted.get(key, 0.0) + gain
        return wanted

    def _plans(self, runtimes) -> tuple[Planner, Planner, dict[tuple[int, int], str]]:
        """The planner over the measured points, the hopeful planner over `runtimes`, and which
        runtime each hopeful point is."""
        hopeful_figures = {(r, t, b): float(figure[i, j]) for r in runtimes
                           for figure in [self._hopeful(r)]
                           for i, t in enumerate(self.threads) for j, b in enumerate(self.batches)}
        best, _ = self._planner(self.measured)
        hopeful, runtime_of = self._planner(hopeful_figures)
        return best, hopeful, runtime_of

    def within(self) -> float:
        """How far, by the fit, the measured plans may be from the grid's best: the worst, over the
        grid's batches, of best / hopeful - 1 (0 where no unmeasured point can do better), over the
        runtimes designed (unmeasured() names the others)."""
        designed = [r for r in self.runtimes if self._designed(r)]
        if not designed:
            return math.inf
        best, hopeful, _ = self._plans(designed)
        ratios = [best.table[self.cores, b] / hopeful.table[self.cores, b] for b in self.batches]
        return max(0.0, max(ratios) - 1)

    def predicted_ms(self, keys) -> dict[Key, float | None]:
        """Each point's predicted figure: its runtime's fit, else (not designed yet) the mean of the
        designed runtimes' fits there; None before any fit."""
        designed = [r for r in self.runtimes if self._designed(r)]
        fits = {r: self._predict(r) for r in designed}
        found: dict[Key, float | None] = {}
        for runtime, t, b in keys:
            used = [runtime] if runtime in fits else designed
            i, j = self.threads.index(t), self.batches.index(b)
            found[runtime, t, b] = statistics.fmean(float(fits[r][i, j]) for r in used) if used else None
        return found

    def _rivals(self, best: Planner) -> list[Key]:
        """Each measured plan's instances under the runtimes not measured there predicted within RIVAL of
        its figure (1.5 RIVAL for runtimes measured past their design): two fits compare less well
        than each fits its own runtime."""
        predicted = {r: self._predict(r) for r in self.runtimes}
        contending = set(self.runtimes) - set(self.dropped())
        wanted: list[Key] = []
        for batch in (b for b in self.batches if np.isfinite(best.table[self.cores, b])):
            for instance in best.plan(self.cores, batch).instances:
                t, b = instance.threads, instance.batch
                i, j = self.threads.index(t), self.batches.index(b)
                wanted += [(r, t, b) for r in self.runtimes if (r, t, b) not in self.measured
                           and (r, t, b) not in wanted
                           and predicted[r][i, j] < instance.latency_ms * (1 + (1.5 * RIVAL if r in contending else RIVAL))]
        return wanted

    def unmeasured(self) -> list[str]:
        """The runtimes whose design points were not all measured (a costly one the budget left no
        time to build for): the plans are not bounded against them."""
        return [r for r in self.runtimes if not self._designed(r)]

    def dropped(self) -> list[str]:
        """The runtimes measured at their design points alone: none of their other points could win."""
        return [r for r in self.runtimes if set(self._own(r)) <= set(self._design(r))]


class FullGrid(Search):
    """Every point of the grid under every runtime: `packrat profile --full-grid`, and the yardstick."""

    def wanted(self, cover_only: bool = False) -> dict[Key, float]:
        return dict.fromkeys(((r, t, b) for t in self.threads for b in self.batches for r in self.runtimes
                              if (r, t, b) not in self.measured), 1.0)


def filled_items(items: list[tuple[int, int, float]], points: dict[tuple[int, int, str], float],
                 threads: list[int], batches: list[int]) -> list[tuple[int, int, float]]:
    """`items` (a profile's chosen (threads, batch, ms)) and, at every other point of `threads` ×
    `batches`, the least of the fits of the runtimes of `points` ((t, b, runtime) -> ms) with
    FIT_POINTS each: a node's share of fewer cores needs points a search for all of them skipped
    (docs/benchmarks/multi-model.md, issue 69)."""
    runtimes = tuple(sorted({r for *_, r in points}))
    search = Search(threads, batches, runtimes)
    search.measured.update({(r, t, b): ms for (t, b, r), ms in points.items()  # not record(): no errors wanted
                            if t in search.threads and b in search.batches})
    filled = {(t, b): ms for t, b, ms in items}
    fits = [search._predict(r) for r in runtimes if len(search._own(r)) >= FIT_POINTS]
    for i, t in enumerate(search.threads):
        for j, b in enumerate(search.batches):
            if (t, b) not in filled and fits:
                filled[t, b] = min(float(fit[i, j]) for fit in fits)
    return [(t, b, ms) for (t, b), ms in sorted(filled.items())]
