"""Runtimes dropped from a profile where they are dominated. Pure: figures in, runtimes out.

The profiler measures every ⟨t, b⟩ under each runtime back to back, and the planner takes each
point's figure from the runtime that is fastest beyond the noise (profiles.choose_runtime). A
runtime beaten beyond the noise at point after point is, as a rule, not chosen at the rest either,
and measuring it can cost most of a profile's time (inductor's AOT packages, one per ⟨t, b⟩). So a
runtime slower than the fastest one beyond the noise (by more than either figure's spread and by
RUNTIME_MARGIN at least: the margin that lets a runtime take a point) at DROP_AFTER points in a
row or more, and never faster than every other beyond the noise, is measured no further once those
points
- differ, two of them, in both threads and batch (not one thread count's verdict), and
- reach the grid's large half: a thread count of at least half the largest, and a batch of at least
  half the largest (runtimes scale differently with threads; a verdict from 1 and 2 threads does
  not hold at 16).
The grid is measured diagonal first (`diagonal_first`), so points of other thread counts and
batches come early; the profiler times each dropped runtime again at the grid's corners
(`corners`) before it ends, since a rule of thumb can still be wrong there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packrat.profiling.profiles import dominated

DROP_AFTER = 2  # points in a row at which a runtime is dominated before it is measured no further


def diagonal_first(threads: list[int], batches: list[int]) -> list[tuple[int, int]]:
    """The grid's opposite corners first (the fewest threads with the smallest batch, the most with
    the largest: a verdict after them spans the grid), then its points by their distance from the
    diagonal between them (each axis as a share of its length); of two alike, the smaller ones
    (cheaper to measure), the smaller batch first."""
    ts, bs = sorted(threads), sorted(batches)

    def share(index: int, count: int) -> float:
        return index / (count - 1) if count > 1 else 0.0

    def key(p: tuple[int, int]):
        i, j = p
        corner = p in ((0, 0), (len(ts) - 1, len(bs) - 1))
        return not corner, round(abs(share(i, len(ts)) - share(j, len(bs))), 9), i + j, j, i

    return [(ts[i], bs[j]) for i, j in sorted(((i, j) for i in range(len(ts)) for j in range(len(bs))), key=key)]


def corners(threads: list[int], batches: list[int]) -> list[tuple[int, int]]:
    """Where a dropped runtime is timed again: ⟨T, 1⟩, ⟨T, B⟩ and ⟨T/2, B/2⟩ for the grid's largest
    T and B (its smallest batch for 1, and the grid's values nearest below the halves)."""
    ts, bs = sorted(threads), sorted(batches)
    half_t = max([t for t in ts if 2 * t <= ts[-1]] or ts[:1])
    half_b = max([b for b in bs if 2 * b <= bs[-1]] or bs[:1])
    return list(dict.fromkeys([(ts[-1], bs[0]), (ts[-1], bs[-1]), (half_t, half_b)]))


@dataclass
class DominanceWatch:
    """Which of `runtimes` the profile still measures, on a grid whose largest thread count and batch
    are `most_threads` and `most_batch`. point() hears each point's figures once every active
    runtime has measured it (planned-on figure and spread per runtime)."""
    runtimes: tuple[str, ...]
    most_threads: int
    most_batch: int
    drop_after: int = DROP_AFTER
    dropped: dict[str, str] = field(default_factory=dict)  # runtime -> why
    _streak: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)  # runtime -> points dominated in a row
    _won: set[str] = field(default_factory=set)  # runtimes that beat all others somewhere: never dropped

    @property
    def active(self) -> tuple[str, ...]:
        return tuple(r for r in self.runtimes if r not in self.dropped)

    def point(self, threads: int, batch: int, figures: dict[str, tuple[float, float]]) -> list[str]:
        """The runtimes this point's figures drop (said in `dropped`)."""
        figures = {r: f for r, f in figures.items() if r not in self.dropped}
        if len(figures) < 2:
            return []
        fastest = min(figures, key=lambda r: (figures[r][0], r))
        beaten = dominated(figures)  # by the margin that lets a runtime take a point
        if len(beaten) == len(figures) - 1:  # a win beyond the noise, not a tie kept by the choosing rule
            self._won.add(fastest)
        newly = []
        for runtime in figures:
            streak = self._streak.setdefault(runtime, [])
            if runtime not in beaten:
                streak.clear()
                continue
            streak.append((threads, batch, f"⟨{threads}, {batch}⟩ {figures[runtime][0]:.1f} ms against {fastest}'s "
                                           f"{figures[fastest][0]:.1f}"))
            if (len(streak) >= self.drop_after and runtime not in self._won and _spans(streak)
                    and self._reaches(streak)):
                self.dropped[runtime] = "dominated at " + "; ".join(text for *_, text in streak[-4:])
                newly.append(runtime)
        return newly


    def _reaches(self, streak: list[tuple[int, int, str]]) -> bool:
        """Whether the points reach the grid's large half in threads and in batch (not necessarily at
        one point): where scaling differs most between runtimes, a verdict from small points fails."""
        return (any(2 * t >= self.most_threads for t, _, _ in streak)
                and any(2 * b >= self.most_batch for _, b, _ in streak))


def _spans(streak: list[tuple[int, int, str]]) -> bool:
    """Whether two of the points differ in both threads and batch."""
    return any(t1 != t2 and b1 != b2 for t1, b1, _ in streak for t2, b2, _ in streak)
