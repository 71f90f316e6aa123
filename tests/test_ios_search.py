"""The IOS dynamic program against brute force, with a synthetic stage-cost model."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from ios_scheduler.search import IOSSearch, thread_splits


def random_dag(rng: random.Random, n: int, density: float) -> list[int]:
    """succ bitmasks of a random DAG numbered topologically."""
    return [sum(1 << j for j in range(i + 1, n) if rng.random() < density) for i in range(n)]


def synthetic_cost(work: list[float], threads: int):
    """Each op has `work`; a group with k threads runs its ops at speed k^0.6 (diminishing
    returns); a stage takes its slowest group plus a fixed launch overhead per group."""

    def cost(groups, split):
        return max(sum(work[op] for op in g) / (k ** 0.6) for g, k in zip(groups, split)) + 0.3 * len(groups)

    return cost


def brute_force(search: IOSSearch, state: int) -> float:
    """Every sequence of endings, no memo."""
    if state == 0:
        return 0.0
    best = float("inf")
    for ending in search.endings(state):
        stage = search.best_stage(ending)
        if stage is not None:
            best = min(best, brute_force(search, state & ~ending) + stage.cost)
    return best


def check_schedule(succ: list[int], stages) -> None:
    """Every op exactly once; an op runs in a later stage than its predecessors, or in the
    same group after them."""
    where = {}
    for s, stage in enumerate(stages):
        for g, group in enumerate(stage.groups):
            for position, op in enumerate(group):
                assert op not in where, f"op {op} scheduled twice"
                where[op] = (s, g, position)
    assert sorted(where) == list(range(len(succ)))
    for op, mask in enumerate(succ):
        for nxt in range(len(succ)):
            if (mask >> nxt) & 1:
                (s1, g1, p1), (s2, g2, p2) = where[op], where[nxt]
                assert s1 < s2 or (s1 == s2 and g1 == g2 and p1 < p2)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 7), density=st.floats(0.0, 0.6), threads=st.integers(1, 4),
       group_size=st.integers(1, 3), groups=st.integers(1, 3))
def test_dp_matches_brute_force_and_is_valid(seed, n, density, threads, group_size, groups):
    rng = random.Random(seed)
    succ = random_dag(rng, n, density)
    work = [rng.uniform(0.5, 5.0) for _ in range(n)]
    search = IOSSearch(succ, threads, synthetic_cost(work, threads), max_group_size=group_size, max_num_groups=groups)
    result = search.solve()
    assert result.cost == pytest.approx(brute_force(search, (1 << n) - 1))
    assert result.cost == pytest.approx(sum(stage.cost for stage in result.stages))
    assert result.cost <= result.sequential_cost + 1e-9  # the sequential schedule is a candidate
    check_schedule(succ, result.stages)


def test_independent_branches_run_concurrently_when_that_is_cheaper():
    # a → (b, c, d) → e: three equal branches on 3 threads
    succ = [0b01110, 0b10000, 0b10000, 0b10000, 0]
    work = [1.0, 6.0, 6.0, 6.0, 1.0]
    result = IOSSearch(succ, 3, synthetic_cost(work, 3)).solve()
    middle = [s for s in result.stages if set(s.ops) == {1, 2, 3}]
    assert middle and len(middle[0].groups) == 3 and middle[0].threads == (1, 1, 1)


def test_endings_include_overlapping_chain_closures():
    # a → c, b → c, b → d: {c, d} and {b, c, d} are endings; {b} alone is not
    succ = [0b0100, 0b1100, 0, 0]
    search = IOSSearch(succ, 2, lambda g, s: 1.0)
    endings = set(search.endings(0b1111))
    assert {0b1100, 0b1110, 0b0100, 0b1000, 0b1111, 0b1101} <= endings
    assert 0b0010 not in endings


def test_merge_candidates_are_used_when_cheaper():
    succ = [0b110, 0, 0]  # x → (conv1, conv2)
    merge = lambda ops, threads: 1.0 if set(ops) == {1, 2} else None  # noqa: E731
    result = IOSSearch(succ, 2, lambda g, s: 5.0 * sum(map(len, g)), merge_cost=merge).solve()
    assert [s.kind for s in result.stages] == ["parallel", "merge"]


def test_thread_splits():
    assert thread_splits(4, 1) == [(4,)]
    assert sorted(thread_splits(4, 2)) == [(1, 3), (2, 2), (3, 1)]
    assert thread_splits(2, 3) == [(1, 1, 1)]


def test_rejects_non_topological_numbering():
    with pytest.raises(ValueError, match="topologically"):
        IOSSearch([0, 0b1], 1, lambda g, s: 1.0)
