"""The pool's stage accounting (packrat.serving.pool.stages): plain numbers, no processes, no timings."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from packrat.serving.pool.stages import INSTANCE_STAMPS, PARENT_SENT, STAGES, StageTimes, stage_ms

STAMPS = len(STAGES) + 1


def stamps_from(steps: list[float], start: float = 1000.0) -> list[float]:
    """Stamps (s) that advance by `steps` (s) one after another."""
    stamps = [start]
    for step in steps:
        stamps.append(stamps[-1] + step)
    return stamps


def test_the_stamps_are_the_parents_then_the_instances_then_the_parents():
    assert PARENT_SENT + INSTANCE_STAMPS + 2 == STAMPS  # received and handed out: the parent's last two


@given(st.lists(st.floats(0, 5), min_size=len(STAGES), max_size=len(STAGES)))
def test_stages_are_the_gaps_between_stamps_and_add_up(steps):
    stamps = stamps_from(steps)
    stages = stage_ms(stamps)
    assert len(stages) == len(STAGES) and all(ms >= 0 for ms in stages)
    assert sum(stages) == pytest.approx((stamps[-1] - stamps[0]) * 1e3, abs=1e-6)


@given(st.lists(st.floats(-1, 1), min_size=len(STAGES), max_size=len(STAGES)))
def test_a_stamp_before_the_previous_one_counts_as_it(steps):
    """Stamps of two processes may be a hair out of order: no stage is negative, and together
    they still span first to last stamp."""
    stamps = stamps_from(steps)
    stages = stage_ms(stamps)
    assert all(ms >= 0 for ms in stages)
    assert sum(stages) == pytest.approx((max(stamps) - stamps[0]) * 1e3, abs=1e-6)


def test_an_early_wake_stamp_makes_the_wake_zero_not_negative():
    stamps = stamps_from([0.001] * len(STAGES))
    wake = STAGES.index("wake")
    stamps[wake + 1] = stamps[wake] - 0.0005  # received before the parent's "sent"
    stages = dict(zip(STAGES, stage_ms(stamps)))
    assert stages["wake"] == 0 and stages["send"] == pytest.approx(1.0)
    assert stages["locks"] == pytest.approx(2.0)  # the next stage starts from the parent's "sent"


def test_the_wrong_number_of_stamps_is_refused():
    with pytest.raises(ValueError, match="stamps"):
        stage_ms([0.0] * (STAMPS - 1))


def test_nothing_recorded_reports_nothing():
    times = StageTimes()
    assert times.means() == {} and times.medians() == {}
    assert times.requests_per_sub_batch() == 0 and times.sub_batches == 0


def test_means_cover_every_stage_and_add_up_to_the_total():
    times = StageTimes()
    for scale, requests in ((1.0, 4), (2.0, 4), (3.0, 2)):
        times.add(stamps_from([scale * 0.001 * (i + 1) for i in range(len(STAGES))]), requests)
    means = times.means()
    assert list(means) == [*STAGES, "total"]
    assert all(ms >= 0 for ms in means.values())
    assert sum(means[stage] for stage in STAGES) == pytest.approx(means["total"])
    assert means["model"] > means["queue"]  # the 7th gap is 7 times the first, in every sub-batch
    assert times.requests_per_sub_batch() == pytest.approx(10 / 3) and times.sub_batches == 3


def test_medians_are_per_stage_and_the_total_is_the_median_sub_batch():
    times = StageTimes()
    for scale in (1.0, 2.0, 10.0):
        times.add(stamps_from([scale * 0.001] * len(STAGES)), 1)
    medians = times.medians()
    assert all(medians[stage] == pytest.approx(2.0) for stage in STAGES)
    assert medians["total"] == pytest.approx(2.0 * len(STAGES))


def test_the_window_keeps_the_recent_sub_batches_and_clear_empties_it():
    times = StageTimes(window=2)
    for requests in (1, 3, 5):
        times.add(stamps_from([0.001] * len(STAGES)), requests)
    assert times.requests_per_sub_batch() == 4 and times.sub_batches == 3
    times.clear()
    assert times.means() == {} and times.sub_batches == 3  # the count since start stays
