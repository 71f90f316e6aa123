"""The batch-size estimator on synthetic sequences of batch sizes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, strategies as st

from packrat.serving.estimator import BatchSizeEstimator, EstimatorSettings, floor_power_of_two, nearest_power_of_two


def feed(estimator: BatchSizeEstimator, sizes_per_second: list[list[int]], start: float = 0.0) -> list[tuple[int, int]]:
    """Feed one list of batch sizes per second; return (second, proposed target) pairs."""
    proposals = []
    estimator.check(start)
    for second, sizes in enumerate(sizes_per_second, start=1):
        for size in sizes:
            estimator.observe(size)
        target = estimator.check(start + second)
        if target is not None:
            proposals.append((second, target))
    return proposals


def test_nearest_power_of_two_on_a_log_scale():
    assert [nearest_power_of_two(v) for v in (0.5, 1, 1.41, 1.42, 2.8, 2.9, 5.6, 5.7, 7.4, 8, 11.3, 11.4)] == \
        [1, 1, 1, 2, 2, 4, 4, 8, 8, 8, 8, 16]


def test_floor_power_of_two():
    assert [floor_power_of_two(v) for v in (0.2, 1, 1.9, 2, 3.99, 4, 7, 8, 1000)] == [1, 1, 1, 2, 2, 4, 4, 8, 512]


def test_steady_load_proposes_nothing():
    est = BatchSizeEstimator(current=4, max_batch=8)
    assert feed(est, [[4] * 20] * 30) == []


def test_step_up_then_down_switches_once_each_way():
    est = BatchSizeEstimator(current=1, max_batch=16)
    proposals = feed(est, [[1] * 20] * 10 + [[16] * 5] * 25 + [[2] * 20] * 20)
    ups = [(s, t) for s, t in proposals if s <= 35]
    downs = [(s, t) for s, t in proposals if s > 35]
    # α = 0.1 per batch at 5 batches/s climbs through 8 before 16: at most one stop on the way
    assert ups[-1][1] == 16 and len(ups) <= 2 and all(10 < s <= 30 for s, _ in ups)
    assert downs[-1][1] == 2 and len(downs) <= 2 and downs[-1][0] <= 35 + 8


def test_full_batches_target_the_configured_size_even_if_not_a_power_of_two():
    est = BatchSizeEstimator(current=4, max_batch=12)
    assert feed(est, [[12] * 10] * 15)[-1][1] == 12


def test_noise_around_a_power_of_two_boundary_does_not_flap():
    rng = random.Random(0)
    est = BatchSizeEstimator(current=4, max_batch=8)
    seconds = [[rng.choice([3, 4, 5]) for _ in range(20)] for _ in range(300)]
    assert feed(est, seconds) == []  # the average sits right at 4: hysteresis holds the target


def test_a_closed_loop_whose_answers_come_back_together_is_seen_whole():
    """4 users, the fat plan answering all four at once: their next requests arrive one by one, each
    seen with those before it (1, 2, 3, 4); under a split plan the answers are staggered (about 4).
    Both are a load of 4: no switch either way (the mean of 1..4, 2.5, once proposed B = 2)."""
    together = BatchSizeEstimator(current=4, max_batch=8)
    assert feed(together, [[1, 2, 3, 4] * 5] * 60) == []
    staggered = BatchSizeEstimator(current=4, max_batch=8)
    assert feed(staggered, [[4, 3, 4, 4, 3] * 4] * 60) == []
    fewer = BatchSizeEstimator(current=4, max_batch=8)  # two users now: 1, 2, 1, 2, ...
    assert feed(fewer, [[1, 2] * 10] * 30)[-1][1] == 2


def test_the_peak_forgets_what_is_older_than_its_window():
    from packrat.serving.estimator import PEAK_WINDOW_S

    est = BatchSizeEstimator(current=8, max_batch=8, settings=EstimatorSettings(alpha=1.0))
    est.observe(8, now=0.0)
    est.observe(1, now=PEAK_WINDOW_S / 2)
    assert est.average == 8  # the same wave
    est.observe(1, now=PEAK_WINDOW_S * 2)
    assert est.average == 1  # a sparse load after the burst: seen as it is


def test_fast_oscillation_does_not_flap():
    est = BatchSizeEstimator(current=2, max_batch=8)
    seconds = [[8] * 10 if s % 2 else [1] * 10 for s in range(120)]  # 1 ↔ 8 every second
    assert len(feed(est, seconds)) <= 1


def test_checks_happen_once_per_period():
    est = BatchSizeEstimator(current=1, max_batch=8, settings=EstimatorSettings(window=1, period_s=5.0))
    est.check(0.0)
    est.observe(8)
    assert est.check(1.0) is None  # within the period: nothing taken
    assert est.check(5.0) == 8
    assert est.check(6.0) is None


def test_idle_periods_keep_the_target():
    est = BatchSizeEstimator(current=4, max_batch=8, settings=EstimatorSettings(window=1))
    assert feed(est, [[]] * 10) == []


@given(sizes=st.lists(st.integers(1, 64), min_size=1, max_size=200),
       alpha=st.floats(0.01, 1.0), window=st.integers(1, 12))
def test_targets_are_powers_of_two_or_the_configured_size(sizes, alpha, window):
    est = BatchSizeEstimator(current=1, max_batch=48, settings=EstimatorSettings(alpha=alpha, window=window))
    for target in (t for _, t in feed(est, [[s] for s in sizes])):
        assert 1 <= target <= 48
        assert target == 48 or target & (target - 1) == 0


@pytest.mark.parametrize("kwargs", [{"alpha": 0}, {"alpha": 1.5}, {"window": 0}, {"period_s": 0},
                                    {"hysteresis": 1.0}])
def test_settings_are_checked(kwargs):
    with pytest.raises(ValueError):
        EstimatorSettings(**kwargs)
