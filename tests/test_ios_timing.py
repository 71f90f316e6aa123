"""Stage-cost tables and the timer's bounds (ios_scheduler.timing)."""

from __future__ import annotations

import os

import pytest
import torch

from packrat.ios_scheduler.candidates import example_values
from packrat.ios_scheduler.graph import capture
from packrat.ios_scheduler.runtime import WorkerSet
from packrat.ios_scheduler.timing import BOUND_SLACK, CostTable, StageTimer
from packrat.models.zoo import resolve

KEY = ("parallel", (("conv_a", "relu_a"), ("conv_b",)), (1, 1))


def test_cost_tables_round_trip():
    table = CostTable("tiny", 8, 2, {KEY: 3.25, ("merge", (("c1",), ("c2",)), (2,)): 1.5})
    again = CostTable.from_json(table.to_json())
    assert again == table


def test_a_cost_bounds_larger_batches_as_is_and_smaller_ones_in_proportion():
    table = CostTable("tiny", 8, 2, {KEY: 10.0})
    assert table.bound(KEY, 16) == pytest.approx(10.0 * (1 - BOUND_SLACK))
    assert table.bound(KEY, 8) == pytest.approx(10.0 * (1 - BOUND_SLACK))
    assert table.bound(KEY, 2) == pytest.approx(10.0 * 2 / 8 * (1 - BOUND_SLACK))  # 8 = four runs of 2
    assert table.bound(("parallel", (("other",),), (2,)), 16) is None


def test_a_broken_table_is_a_one_line_error():
    with pytest.raises(ValueError, match="not a stage cost table"):
        CostTable.from_json('{"model": "tiny"}')


def timer_for(batch: int, bounds=None) -> StageTimer:
    spec = resolve("tiny")
    x = spec.example_input(batch)
    graph = capture(spec.build().eval(), (x,))
    workers = WorkerSet(sorted(os.sched_getaffinity(0))[:2])
    return StageTimer(graph, example_values(graph, (x,)), workers, "tiny", 2, batch, 1, 2, bounds)


def test_candidates_have_the_same_key_at_every_batch_size_and_bound_each_other():
    small, large = timer_for(1), timer_for(4)
    try:
        groups, split = ((0,),), (2,)
        with torch.inference_mode():
            small.parallel(groups, split)
        assert small.candidates.key("parallel", groups, split) == large.candidates.key("parallel", groups, split)
        bounded = timer_for(4, small.table)
        assert bounded.lower_bound("parallel", groups, split) == small.table.bound(
            small.candidates.key("parallel", groups, split), 4)
        bounded.workers.close()
    finally:
        small.workers.close()
        large.workers.close()


def test_a_table_of_another_model_is_refused():
    with pytest.raises(ValueError, match="cannot bound"):
        timer_for(1, CostTable("squeezenet", 1, 2))


@pytest.mark.parametrize("script,expected", [
    # medians P 1, Q 2, F then P 5, F then Q 3 (each case's outlier ignored): 5 - 3 - 1 + 2
    ({"P": [1, 1, 9], "Q": [2, 2, 2], "FP": [5, 5, 5], "FQ": [3, 3, 30]}, 3.0),
    # concurrency cheaper than the same operators in order: no negative cost
    ({"P": [4, 4, 4], "Q": [1, 1, 1], "FP": [5, 5, 5], "FQ": [3, 3, 3]}, 0.0),
])
def test_the_switch_cost_is_what_concurrency_adds_after_a_full_width_stretch_beyond_the_same_order(
        monkeypatch, script, expected):
    """timing.switch_cost: t(F then P) - t(F then Q) - t(P) + t(Q) over medians of interleaved
    rounds, so the caches F leaves cold (paid by Q as much as by P) are not charged to concurrency,
    and the figure is measured once and kept."""
    import packrat.ios_scheduler.timing as timing

    timer = timer_for(1)
    order = ["P", "Q", "FP", "FQ"] * 3  # interleaved: every case once a round
    returns = iter([float(script[name][index // 4]) for index, name in enumerate(order)])
    calls = []
    monkeypatch.setattr(timing, "time_call", lambda call, warmup, repeats: calls.append(call) or next(returns))
    try:
        assert timer.switch_cost(rounds=3) == expected
        assert len(calls) == 12 and timer.switch_cost() == expected and len(calls) == 12  # kept
    finally:
        timer.workers.close()
