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


def test_the_switch_cost_is_measured_once_and_never_negative():
    """What concurrency adds beyond the same operators in order (timing.switch_cost): a figure, kept."""
    timer = timer_for(1)
    try:
        first = timer.switch_cost(rounds=5)
        assert first >= 0.0 and first == timer.switch_cost() and first < 1e3
    finally:
        timer.workers.close()
