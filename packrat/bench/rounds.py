"""Interleaved rounds: every case measured once a round, in an order that changes from round to
round, so that a busy machine's drift hits every case alike; the clock; medians with their spread.
Standard library only: the benchmarks' light scripts use it too."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence


def elapsed_ms(fn: Callable[[], object]) -> float:
    """The wall time of one call of fn, in ms."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def rotated(items: Sequence, by: int) -> list:
    """`items` started at index `by` (mod their count): over len(items) rounds each takes every place once."""
    shift = by % len(items) if items else 0
    return list(items[shift:]) + list(items[:shift])


def round_order(items: Sequence, round_index: int, rng=None) -> list:
    """Round `round_index`'s order: `items` rotated by it, or shuffled anew with `rng`."""
    if rng is None:
        return rotated(items, round_index)
    order = list(items)
    rng.shuffle(order)
    return order


def in_rounds(items: Sequence, rounds: int, rng=None) -> Iterator[tuple[int, object]]:
    """(round, item) for every item in rounds 1..`rounds`, each round in its round_order."""
    for round_index in range(rounds):
        for item in round_order(items, round_index, rng):
            yield round_index + 1, item


def interleaved(cases: Mapping[str, Callable[[], float]], rounds: int, rng=None,
                progress: Callable[[], object] | None = None, last: str | None = None) -> dict[str, list[float]]:
    """Each case's figures (its call's return) over interleaved rounds; `last` closes every round (it warms
    what follows); `progress()` after each round."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    others = [name for name in cases if name != last]
    for round_index in range(rounds):
        for name in round_order(others, round_index, rng) + [name for name in cases if name == last]:
            samples[name].append(cases[name]())
        if progress:
            progress()
    return samples


def grouped_rounds(anchors: Sequence, cases: Sequence, start: Callable[[object], bool],
                   time_one: Callable[[object, int, int], bool], stop: Callable[[object], object], rounds: int,
                   rng=None, full: Callable[[], bool] = lambda: False, after_round=lambda group, r: None) -> int:
    """Interleaved rounds over what fits at once; the number of groups. The `anchors` stay up throughout;
    `cases` start until full() (one at least a group), each group timed for `rounds` rounds, then stopped."""
    anchors, pending, group = [a for a in anchors if start(a)], list(cases), 0
    while True:
        live: list = []
        while pending and (not live or not full()):
            case = pending.pop(0)
            live += [case] if start(case) else []
        for r in range(1, rounds + 1):
            for case in round_order(anchors + live, r - 1, rng):
                if not time_one(case, group, r):  # it died: timed no further
                    (anchors if case in anchors else live).remove(case)
            after_round(group, r)
        for case in live:
            stop(case)
        group += 1
        if not pending:
            break
    for case in anchors:
        stop(case)
    return group


def medians(samples: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each case's median."""
    return {name: statistics.median(values) for name, values in samples.items()}


def median_spread(values: Sequence) -> dict | None:
    """{"median", "spread": [min, max]} of the finite numbers among `values`; None when there are none."""
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return {"median": statistics.median(numbers), "spread": [min(numbers), max(numbers)]} if numbers else None


def paired(samples: Mapping, reference: Mapping) -> list[float]:
    """sample / reference per round both ran in: side by side, so the drift between rounds leaves them alone."""
    return [value / reference[key] for key, value in samples.items() if reference.get(key)]


def over_rounds(rounds: Sequence, summed: Collection[str] = (), kept: Collection[str] = ()):
    """Rounds' results of one shape (nested dicts) as one: each number's median_spread, the total under a key
    in `summed`, the first round's value under one in `kept`."""
    dicts = [r for r in rounds if isinstance(r, dict)]
    if not dicts:
        return median_spread(rounds)
    merged = {}
    for key in dict.fromkeys(k for d in dicts for k in d):
        values = [d[key] for d in dicts if key in d]
        merged[key] = sum(values) if key in summed else values[0] if key in kept else over_rounds(values, summed, kept)
    return merged
