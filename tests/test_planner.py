"""The planner's DP against brute force, and hand-made tables with known answers."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings, strategies as st

from packrat.errors import NoPlanError
from packrat.planning.planner import Planner, plan
from packrat.machine.topology import Topology


def brute_force(items, threads, batch):
    """Best (max latency, instances, threads) over every multiset with Σt ≤ T, Σb = B."""
    best = None

    def search(start, t_left, b_left, worst, count, used):
        nonlocal best
        if b_left == 0:
            key = (worst, count, used)
            best = key if best is None or key < best else best
            return
        for index in range(start, len(items)):
            t, b, latency = items[index]
            if t <= t_left and b <= b_left:
                search(index, t_left - t, b_left - b, max(worst, latency), count + 1, used + t)

    search(0, threads, batch, 0.0, 0, 0)
    return best


tables = st.dictionaries(
    keys=st.tuples(st.integers(1, 4), st.integers(1, 5)),
    values=st.integers(1, 30).map(float),  # small integers: many ties, which exercise tie-breaking
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(table=tables, threads=st.integers(1, 7), batch=st.integers(1, 8))
def test_dp_matches_brute_force(table, threads, batch):
    items = [(t, b, l) for (t, b), l in sorted(table.items())]
    expected = brute_force(items, threads, batch)
    if expected is None:
        with pytest.raises(NoPlanError):
            plan(items, threads, batch)
        return
    result = plan(items, threads, batch)
    key = (result.expected_latency_ms, len(result.instances), result.threads_used)
    assert key == expected
    assert sum(i.batch for i in result.instances) == batch
    assert result.threads_used <= threads
    assert all(table[i.threads, i.batch] == i.latency_ms for i in result.instances)


@settings(max_examples=50, deadline=None)
@given(table=tables, threads=st.integers(1, 7), batch=st.integers(1, 8))
def test_table_is_monotone_in_threads_and_never_worse_than_fat(table, threads, batch):
    items = [(t, b, l) for (t, b), l in table.items()]
    planner = Planner(items, threads, batch)
    for t in range(1, threads):
        assert (planner.table[t + 1] <= planner.table[t]).all()  # more cores never hurt
    if (threads, batch) in table:
        assert planner.plan(threads, batch).expected_latency_ms <= table[threads, batch]


def test_heterogeneous_plan_is_optimal():
    # 6 cores, batch 12: ⟨4, 8⟩ + ⟨2, 4⟩ (10 ms) beats every homogeneous split.
    items = [(6, 12, 30.0), (4, 8, 10.0), (2, 4, 10.0), (3, 6, 14.0), (2, 6, 20.0), (1, 2, 12.0), (2, 2, 9.0)]
    result = plan(items, 6, 12)
    assert result.expected_latency_ms == 10.0
    assert sorted((i.threads, i.batch) for i in result.instances) == [(2, 4), (4, 8)]
    assert result.fat_latency_ms == 30.0
    assert result.speedup == pytest.approx(3.0)


def test_fat_is_chosen_when_it_is_best():
    # Near-linear scaling: splitting never helps.
    items = [(t, b, 10.0 * b / t * (1 + 0.01 * (4 - t))) for t in (1, 2, 4) for b in (1, 2, 4)]
    items = [(t, b, l if (t, b) != (4, 4) else 9.0) for t, b, l in items]
    result = plan(items, 4, 4)
    assert [(i.threads, i.batch) for i in result.instances] == [(4, 4)]
    assert result.speedup == 1.0


def test_ties_prefer_fewer_instances_then_fewer_threads():
    items = [(1, 1, 5.0), (2, 2, 5.0), (4, 2, 5.0), (3, 2, 5.0)]
    result = plan(items, 4, 2)
    assert [(i.threads, i.batch) for i in result.instances] == [(2, 2)]


def test_uncoverable_batch_says_why():
    items = [(1, 2, 1.0), (1, 4, 2.0)]
    with pytest.raises(NoPlanError, match="batch 3 cannot be split"):
        plan(items, 4, 3)
    with pytest.raises(NoPlanError, match="at most 1 threads"):
        plan(items, 1, 6)  # needs two instances, only one core
    with pytest.raises(NoPlanError, match="no profiled point"):
        plan([(8, 1, 1.0)], 4, 1)


def test_plan_assigns_disjoint_contiguous_cores_within_sockets():
    items = [(4, 4, 10.0), (2, 2, 10.0), (8, 8, 50.0)]
    topo = Topology(((0, 1, 2, 3, 4, 5), (6, 7, 8, 9, 10, 11)))
    result = Planner(items, 12, 12).plan(12, 10, topo)  # 2×⟨4,4⟩ + ⟨2,2⟩
    assert sorted((i.threads, i.batch) for i in result.instances) == [(2, 2), (4, 4), (4, 4)]
    cores = [c for inst in result.instances for c in inst.cores]
    assert len(cores) == len(set(cores))
    for inst in result.instances:
        assert len(inst.cores) == inst.threads
        assert list(inst.cores) == list(range(inst.cores[0], inst.cores[0] + inst.threads))
        assert any(set(inst.cores) <= set(s) for s in topo.sockets)


def test_instance_spans_sockets_only_when_unavoidable():
    topo = Topology(((0, 1, 2, 3, 4, 5), (6, 7, 8, 9, 10, 11)))
    cores = topo.assign([4, 4, 4])
    assert cores[0] == [0, 1, 2, 3] and cores[1] == [6, 7, 8, 9]
    assert sorted(cores[2]) == [4, 5, 10, 11]


def test_json_has_exactly_the_documented_keys():
    result = plan([(1, 1, 3.0), (2, 2, 4.0)], 2, 2)
    body = result.to_json()
    assert set(body) == {"threads", "batch", "expected_latency_ms", "fat_latency_ms", "instances"}
    assert body["fat_latency_ms"] == 4.0
    assert body["instances"] == [{"threads": 1, "batch": 1, "cores": [0], "runtime": "inductor"},
                                 {"threads": 1, "batch": 1, "cores": [1], "runtime": "inductor"}]


def test_each_instance_carries_the_runtime_of_its_point():
    items = [(1, 1, 3.0), (2, 2, 4.0), (1, 2, 9.0)]
    planner = Planner(items, 2, 2, {(1, 1): "openvino"})
    chosen = planner.plan(2, 2)
    assert [i.runtime for i in chosen.instances] == ["openvino", "openvino"]
    assert chosen.describe() == "2×⟨1 threads, batch 1, openvino⟩"
    assert planner.fat(2, 2).instances[0].runtime == "inductor"
    assert planner.fat(2, 2).describe() == "1×⟨2 threads, batch 2⟩"


def test_an_unprofiled_fat_instance_runs_the_runtime_chosen_nearest_it():
    """A fat instance at a point the profile never measured (a node's share of fewer cores) runs
    what the profile chose nearest, the same threads first, not the default runtime's package."""
    runtimes = {(1, 1): "openvino", (1, 8): "onnxruntime", (2, 4): "onnxruntime-thread"}
    planner = Planner([(1, 1, 10.0), (1, 8, 80.0), (2, 4, 25.0)], 1, 4, runtimes)
    assert planner.fat(1, 4).instances[0].runtime == "onnxruntime"  # batch 8 nearer 4 than 1 (log)
    assert planner.fat(1, 2).instances[0].runtime == "openvino"
    assert planner.fat(2, 8).instances[0].runtime == "onnxruntime-thread"  # threads first
    assert Planner([(1, 1, 10.0)], 1, 4).fat(1, 4).instances[0].runtime == "inductor"  # nothing chosen


def test_large_table_is_complete():
    items = [(t, 2 ** k, (2 ** k) * 100.0 / t ** 0.7) for t in range(1, 65) for k in range(11)]
    planner = Planner(items, 64, 1024)
    assert planner.table.shape == (65, 1025)
    assert math.isfinite(planner.table[64, 1024])
    result = planner.plan(64, 1000)
    assert sum(i.batch for i in result.instances) == 1000
    assert result.threads_used <= 64


@pytest.mark.parametrize("threads,batch", list(itertools.product([0, -1], [1])) + [(1, 0)])
def test_rejects_nonpositive_sizes(threads, batch):
    with pytest.raises(ValueError):
        Planner([(1, 1, 1.0)], threads, batch)
