"""Where the opt-in ios runtime is measured. Pure: the plain runtimes' figures in, points out.

An IOS schedule can only gain where one operator cannot keep an instance's threads busy (small
batches, many threads: docs/benchmarks/many-core.md); elsewhere a point's schedule search would buy nothing.
"""

from __future__ import annotations

IOS_MAX_BATCH = 4  # IOS gains where a batch cannot fill the threads: small batches only
IOS_EFFICIENCY = 0.5  # measured where the plain runtimes use less than this share of the threads


def thread_efficiency(figures: dict[tuple[int, int], float], threads: int, batch: int) -> float | None:
    """How much of `threads` the plain runtimes used at ⟨threads, batch⟩: the speed-up over the fewest
    threads measured at that batch, divided by the threads' ratio (1: perfect scaling); None when no
    smaller thread count was measured at that batch."""
    fewest = min(t for t, b in figures if b == batch)
    if fewest >= threads:
        return None
    return (figures[fewest, batch] * fewest) / (figures[threads, batch] * threads)


def ios_points(figures: dict[tuple[int, int], float], max_batch: int = IOS_MAX_BATCH,
               efficiency: float = IOS_EFFICIENCY) -> list[tuple[int, int]]:
    """The points ⟨t, b⟩ of `figures` (the plain runtimes' planned figures, ms) where the ios runtime
    is measured: t ≥ 2, b ≤ `max_batch`, and less than `efficiency` of the threads used; batch by
    batch, fewest threads first."""
    found = []
    for t, b in sorted(figures, key=lambda point: (point[1], point[0])):
        if t < 2 or b > max_batch:
            continue
        used = thread_efficiency(figures, t, b)
        if used is not None and used < efficiency:
            found.append((t, b))
    return found
