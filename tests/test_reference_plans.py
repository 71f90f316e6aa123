"""Plans from the 16-core published profiles match the published answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from packrat.planning.planner import Planner
from packrat.profiling.profiles import load

SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference-profiles"
pytestmark = pytest.mark.skipif(not SHARED.exists(), reason="reference profiles not present")


def shapes(plan):
    return sorted((i.threads, i.batch) for i in plan.instances)


def test_resnet_t16_b32_is_eight_instances_of_two_threads():
    profile = load(SHARED / "resnet_large-batches.csv")
    plan = Planner(profile.items(), 16, 32).plan(16, 32)
    assert shapes(plan) == [(2, 4)] * 8
    assert plan.expected_latency_ms == pytest.approx(113.0, abs=0.1)
    assert plan.fat_latency_ms == pytest.approx(273.8, abs=0.1)


@pytest.mark.parametrize("batch,expected", [
    (8, [(8, 4)] * 2),
    *[(b, [(4, b // 4)] * 4) for b in (16, 32, 64, 128)],
    *[(b, [(2, b // 8)] * 8) for b in (256, 512, 1024)],
])
def test_bert_t16_plans_match_the_paper(batch, expected):
    profile = load(SHARED / "bert_large-batches.csv")
    assert shapes(Planner(profile.items(), 16, 1024).plan(16, batch)) == expected


@pytest.mark.parametrize("name", ["resnet", "inception", "bert", "gpt2"])
@pytest.mark.parametrize("threads", [4, 14, 16])
def test_plans_never_slower_than_fat(name, threads):
    profile = load(SHARED / f"{name}_large-batches.csv")
    planner = Planner(profile.items(), threads, 1024)
    for batch in profile.batches:
        plan = planner.plan(threads, batch)
        assert plan.expected_latency_ms <= plan.fat_latency_ms
        assert plan.threads_used <= threads
