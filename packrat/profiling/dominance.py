"""Runtimes dropped from a profile where they are dominated. Pure: figures in, runtimes out.

The profiler measures every ⟨t, b⟩ under each runtime back to back, and the planner takes each
point's figure from the runtime that is fastest beyond the noise (profiles.choose_runtime). A
runtime that the chosen one beats beyond the noise at point after point will not be chosen at the
rest either, as a rule: ResNet-50 on 2 cores ran 4–11 % slower under inductor's AOT code than under
OpenVINO and ONNX Runtime at every point measured (BENCHMARKS.md, issue 25), and inductor's AOT
packages, built one per ⟨t, b⟩, cost 20–40 s each from a cold cache, most of the default profile's
time. So a runtime slower than the fastest one beyond the noise (by more than either figure's spread
and by RUNTIME_MARGIN at least: the margin that lets a runtime take a point), at DROP_AFTER points
in a row of which two differ in both threads and batch, and never faster than every other beyond
the noise, is measured no further. The two points guard against a verdict taken at one thread count
or one batch: on ResNet-50 on 2 cores OpenVINO ran 2.3 % and 4.5 % behind ONNX Runtime at ⟨1, 4⟩ and
⟨1, 8⟩ and took ⟨1, 2⟩, ⟨2, 1⟩ and ⟨2, 4⟩. A wider margin of 5 % kept inductor's packages, 2–9 %
behind, at every point on a noisy day: 274 s for the profile against 126 (issue 48). The grid is
measured diagonal first (`diagonal_first`), so points of other thread counts and batches come early.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packrat.profiling.profiles import dominated

DROP_AFTER = 2  # points in a row at which a runtime is dominated before it is measured no further


def diagonal_first(threads: list[int], batches: list[int]) -> list[tuple[int, int]]:
    """The grid's points, those on its diagonal (the i-th thread count with the i-th batch) first,
    then by distance from it, small ones first and, of two alike, the smaller batch (cheaper to
    measure, and its compiled code is often there already): the first points differ in threads and
    batch."""
    ts, bs = sorted(threads), sorted(batches)
    order = sorted(((i, j) for i in range(len(ts)) for j in range(len(bs))),
                   key=lambda p: (abs(p[0] - p[1]), sum(p), p[1], p[0]))
    return [(ts[i], bs[j]) for i, j in order]


@dataclass
class DominanceWatch:
    """Which of `runtimes` the profile still measures. point() hears each point's figures once every
    active runtime has measured it (planned-on figure and spread per runtime)."""
    runtimes: tuple[str, ...]
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
            if len(streak) >= self.drop_after and runtime not in self._won and _spans(streak):
                self.dropped[runtime] = "dominated at " + "; ".join(text for *_, text in streak[-4:])
                newly.append(runtime)
        return newly


def _spans(streak: list[tuple[int, int, str]]) -> bool:
    """Whether two of the points differ in both threads and batch."""
    return any(t1 != t2 and b1 != b2 for t1, b1, _ in streak for t2, b2, _ in streak)
