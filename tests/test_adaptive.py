"""The adaptive grid against full tables: the measured points must give every plan the full grid gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packrat.profiling import adaptive
from packrat.profiling.adaptive import AdaptiveGrid
from packrat.planning.planner import Planner
from packrat.profiling.profiles import load

SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference-profiles"
REFERENCE = sorted(SHARED.glob("*_large-batches*.csv")) if SHARED.exists() else []


def replay(table: dict[tuple[int, int], float], **kwargs) -> AdaptiveGrid:
    threads = sorted({t for t, _ in table})
    batches = sorted({b for _, b in table})
    grid = AdaptiveGrid(threads, batches, **kwargs)
    adaptive.run(grid, lambda t, b: table[t, b])
    return grid


def worst_plan_ratio(table: dict[tuple[int, int], float], measured: dict[tuple[int, int], float],
                     max_batch: int | None = None) -> float:
    """max over every (T, B) of the measured points' plan latency / the full table's, both
    evaluated on the full table (a measured point's latency is its table value)."""
    threads = max(t for t, _ in table)
    max_batch = max_batch or max(b for _, b in table)
    assert all(table[p] == latency for p, latency in measured.items())
    full = Planner([(t, b, l) for (t, b), l in table.items()], threads, max_batch).table
    partial = Planner([(t, b, l) for (t, b), l in measured.items()], threads, max_batch).table
    finite = np.isfinite(full)
    finite[:, 0] = False
    assert np.array_equal(np.isfinite(partial), np.isfinite(full)), "a batch the full grid covers is not covered"
    return float(np.max(partial[finite] / full[finite]))


def amdahl_table(threads: int, batches: list[int], serial: float, growth: float, noise: list[float] | None = None,
                 slower: tuple[int, int] | None = None) -> dict[tuple[int, int], float]:
    """Amdahl's law with a serial fraction per batch size (larger batches parallelise better, but
    not so much better that latency falls with the batch: that would break assumption A1),
    optional multiplicative noise, and optionally one point made slower than its neighbour below."""
    table = {}
    for j, b in enumerate(batches):
        work = 10.0 * b ** growth
        s = serial * 0.9 ** j
        for t in range(1, threads + 1):
            table[t, b] = work * (s + (1 - s) / t)
    if noise:
        for k, point in enumerate(sorted(table)):
            table[point] *= 1 + noise[k % len(noise)]
    if slower:
        t, b = slower
        table[t, b] = table[t - 1, b] * 1.3
    return table


# ---- small, hand-checked behaviour ----------------------------------------------------------------

def test_the_seed_is_the_fewest_threads_at_every_batch():
    grid = AdaptiveGrid([1, 2, 3, 4], [1, 2, 4])
    seen = []
    while (point := grid.next_point()) and point[0] == 1:
        seen.append(point)
        grid.record(*point, 10.0 * point[1])
    assert seen == [(1, 1), (1, 2), (1, 4)]


def test_bounds_under_linear_scaling_and_the_chord():
    grid = AdaptiveGrid([1, 2, 3, 4, 5], [1], slack=0.0)
    grid.record(1, 1, 100.0)
    grid.record(2, 1, 60.0)
    low = grid.lower_bounds()[:, 0]
    assert low[0] == 100.0 and low[1] == 60.0
    # A2 from t=2: 2/3 of 60 = 40; A3 along the chord 1→2 (rate +1/150 per thread): 1/(1/60 + 1/150) ≈ 42.9
    assert low[2] == pytest.approx(1 / (1 / 60 + 1 / 150))
    assert low[4] == pytest.approx(1 / (1 / 60 + 3 / 150))


def test_a_slower_point_bounds_nothing():
    grid = AdaptiveGrid([1, 2, 3, 4], [1], slack=0.0)
    for t, latency in ((1, 100.0), (2, 50.0), (3, 80.0)):  # three threads slower than two
        grid.record(t, 1, latency)
    assert adaptive._records(grid.latency[:, 0]) == [0, 1]
    assert grid.lower_bounds()[3, 0] < 50.0  # from the records only


def test_a_point_beating_its_bound_makes_the_batch_and_its_neighbours_irregular():
    grid = AdaptiveGrid([1, 2, 3, 4], [1, 2, 4, 8], slack=0.0)
    for b in (1, 2, 4, 8):
        grid.record(1, b, 100.0 * b)
        grid.record(2, b, 60.0 * b)
    bound = grid.lower_bounds()[3, 2]
    grid.record(4, 4, bound * 0.5)
    assert grid.irregular.tolist() == [False, True, True, True]
    # irregular batch sizes use the emulation bound, max over records t' of L(t') / ceil(t / t')
    assert grid.lower_bounds()[2, 1] == pytest.approx(max(200.0 / 3, 120.0 / 2))


def test_stops_at_once_when_one_thread_is_all_there_is():
    grid = replay({(1, 1): 5.0, (1, 2): 9.0})
    assert grid.next_point() is None
    assert len(grid.measured) == 2


def test_tolerance_stops_earlier_and_stays_within_it():
    table = amdahl_table(8, [1, 2, 4, 8, 16, 32], serial=0.3, growth=0.9)
    exact = replay(table)
    loose = replay(table, tolerance=0.05)
    assert len(loose.measured) <= len(exact.measured)
    assert worst_plan_ratio(table, loose.measured) <= 1.05 + 1e-9


def test_resume_records_earlier_points_and_measures_the_rest():
    table = amdahl_table(4, [1, 2, 4], serial=0.2, growth=1.0)
    first = replay(table)
    grid = AdaptiveGrid([1, 2, 3, 4], [1, 2, 4])
    adaptive.resume(grid, [(t, b, l) for (t, b), l in list(first.measured.items())[:3]] + [(9, 9, 1.0)])
    calls = []
    adaptive.run(grid, lambda t, b: calls.append((t, b)) or table[t, b])
    assert len(calls) == len(first.measured) - 3
    assert grid.measured == first.measured


def test_rejects_bad_input():
    with pytest.raises(ValueError):
        AdaptiveGrid([], [1])
    with pytest.raises(ValueError):
        AdaptiveGrid([1], [1], slack=-1)
    with pytest.raises(ValueError):
        AdaptiveGrid([1], [1]).record(1, 1, 0.0)


# ---- generated tables: exact under the assumptions ------------------------------------------------

BATCHES = [1, 2, 4, 8, 16, 32, 64]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(threads=st.integers(2, 8), serial=st.floats(0.0, 0.6), growth=st.floats(0.6, 1.0),
       noise=st.lists(st.floats(-0.02, 0.02), min_size=1, max_size=7))
def test_generated_tables_give_the_full_grids_plans(threads, serial, growth, noise):
    """Steep (serial 0) to flat (serial 0.6) scaling, sub-linear batch growth, ±2 % noise."""
    table = amdahl_table(threads, BATCHES, serial, growth, noise)
    grid = replay(table)
    assert worst_plan_ratio(table, grid.measured) == pytest.approx(1.0, abs=1e-9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(threads=st.integers(3, 8), serial=st.floats(0.0, 0.5), data=st.data())
def test_a_point_where_more_threads_are_slower_changes_no_plan(threads, serial, data):
    t = data.draw(st.integers(2, threads))
    b = data.draw(st.sampled_from(BATCHES))
    table = amdahl_table(threads, BATCHES, serial, 0.9, slower=(t, b))
    grid = replay(table)
    assert worst_plan_ratio(table, grid.measured) == pytest.approx(1.0, abs=1e-9)


def test_measures_less_than_the_grid_where_scaling_flattens():
    table = amdahl_table(8, BATCHES, serial=0.4, growth=1.0)
    grid = replay(table)
    assert len(grid.measured) < grid.grid_size
    assert worst_plan_ratio(table, grid.measured) == pytest.approx(1.0)


# ---- the published 16-core tables ---------------------------------------------------------------

@pytest.mark.skipif(not REFERENCE, reason="reference profiles not present")
@pytest.mark.parametrize("path", REFERENCE, ids=lambda p: p.stem)
@pytest.mark.slow
def test_published_tables_replayed_give_every_plan_for_t_up_to_16_and_b_up_to_1024(path):
    table = load(path).latency
    grid = replay(table, max_batch=1024)
    assert worst_plan_ratio(table, grid.measured, max_batch=1024) == pytest.approx(1.0, abs=1e-9)
    assert len(grid.measured) < grid.grid_size


def test_runtimes_grids_are_measured_back_to_back_and_each_stays_exact():
    """Two runtimes' grids run together: every point either asks for is measured under both, one
    right after the other; each grid's plans are still the full table's."""
    threads, batches = [1, 2, 3, 4], [1, 2, 4, 8]
    tables = {"inductor": {(t, b): 2.0 + b * (1.0 + 3.0 / t) for t in threads for b in batches},
              "onnxruntime": {(t, b): 1.0 + b * (1.2 + 2.5 / t ** 0.8) for t in threads for b in batches}}
    grids = {name: AdaptiveGrid(threads, batches) for name in tables}
    order = []
    adaptive.run_together(grids, lambda name, t, b: order.append((name, t, b)) or tables[name][t, b])
    pairs = [order[i:i + 2] for i in range(0, len(order), 2)]
    assert all([a[0], b[0]] == ["inductor", "onnxruntime"] and a[1:] == b[1:] for a, b in pairs)
    for name, grid in grids.items():
        assert grid.next_point() is None
        assert worst_plan_ratio(tables[name], grid.measured) == pytest.approx(1.0)
    assert len(order) < 2 * len(threads) * len(batches)  # still adaptive: not the whole grid
