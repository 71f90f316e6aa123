"""Where the ios runtime is measured (packrat/profiling/reach.py): pure, on made-up figures."""

from __future__ import annotations

from packrat.profiling.reach import ios_points, thread_efficiency


def figures(scaling: dict[int, float], batches=(1, 2, 8)) -> dict[tuple[int, int], float]:
    """ms at each ⟨t, b⟩: b times the 1-thread figure divided by scaling[t]."""
    return {(t, b): 10.0 * b / speedup for t, speedup in scaling.items() for b in batches}


def test_points_where_half_the_threads_are_idle_at_small_batches():
    # speed-up 1.9 on 2 threads (95 %), 3.0 on 4 (75 %), 3.2 on 8 (40 %), 3.3 on 16 (21 %)
    table = figures({1: 1.0, 2: 1.9, 4: 3.0, 8: 3.2, 16: 3.3})
    assert ios_points(table) == [(8, 1), (16, 1), (8, 2), (16, 2)]  # batch 8 is past IOS_MAX_BATCH
    assert ios_points(table, max_batch=8)[-2:] == [(8, 8), (16, 8)]  # the batch limit, not the figures, left it out
    assert abs(thread_efficiency(table, 8, 1) - 0.4) < 1e-9


def test_a_model_that_scales_gets_no_ios_point():
    assert ios_points(figures({1: 1.0, 2: 2.0, 4: 3.8, 8: 7.0})) == []


def test_efficiency_is_judged_from_the_fewest_threads_measured_at_that_batch():
    table = {(2, 1): 10.0, (8, 1): 9.0, (16, 4): 5.0}  # adaptive profiles measure sparsely
    assert thread_efficiency(table, 8, 1) == 10.0 * 2 / (9.0 * 8)
    assert thread_efficiency(table, 16, 4) is None  # nothing smaller to judge by: not measured
    assert ios_points(table) == [(8, 1)]
