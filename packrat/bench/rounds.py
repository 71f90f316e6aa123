"""Interleaved rounds: every case measured once a round, in an order that changes from round to
round, so that a busy machine's drift hits every case alike; and the clock they are timed with.

Imports nothing but the standard library: the benchmarks' light scripts use it too."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence


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
    """The order of round `round_index` (from 0): `items` rotated by it, or with `rng` (a
    random.Random, or the random module) shuffled anew."""
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
                progress: Callable[[], object] | None = None) -> dict[str, list[float]]:
    """Each case's figures over `rounds` interleaved rounds (in_rounds); a case's call returns its
    own figure (elapsed_ms of what it runs, say). `progress` is called after each round."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for round_index in range(rounds):
        for name in round_order(list(cases), round_index, rng):
            samples[name].append(cases[name]())
        if progress:
            progress()
    return samples


def medians(samples: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each case's median."""
    return {name: statistics.median(values) for name, values in samples.items()}
