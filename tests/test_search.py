"""The profile search (packrat/profiling/search.py) replayed on full tables: the share it measures and
how far the plans made from what it measured are from the full grid's."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from packrat.planning.planner import Planner
from packrat.profiling.search import Search, design

SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference-profiles"
MODELS = ("resnet", "inception", "gpt2", "bert")
BATCHES = (1, 2, 4, 8, 16, 32)
needs_tables = pytest.mark.skipif(not SHARED.exists(), reason="the published tables are not at hand")
Tables = dict[str, dict[tuple[int, int], float]]


def published(model: str) -> Tables:
    """The Packrat authors' 16-core tables of `model` as three runtimes: TorchScript with glibc's
    allocator, with tcmalloc, and eager; threads 1-16 x batches 1-32."""
    def read(name: str, suffix: str) -> dict[tuple[int, int], float]:
        with open(SHARED / name) as handle:
            return {(int(row["intraop_threads"]), int(row["batch_size"])): float(row["latency(avg)"])
                    for row in csv.DictReader(handle)
                    if row["benchmark"].endswith(suffix) and row.get("topology", "sequential") == "sequential"
                    and int(row["batch_size"]) <= BATCHES[-1] and int(row["intraop_threads"]) <= 16}
    return {"glibc": read(f"{model}_large-batches.csv", "_manual_script"),
            "tcmalloc": read(f"{model}_large-batches-tcmalloc.csv", "_manual_script"),
            "eager": read(f"{model}_large-batches.csv", "_manual_none")}


def stretched(table: dict[tuple[int, int], float], factor: int) -> dict[tuple[int, int], float]:
    """The same shape over `factor` times the threads: t threads take what t / factor took (log-log
    between the table's thread counts; below one, near-linear scaling from one)."""
    most = max(t for t, _ in table)
    out = {}
    for t in range(1, most * factor + 1):
        share = t / factor
        for b in BATCHES:
            if share < 1:
                out[t, b] = table[1, b] / share ** 0.95
                continue
            low = int(share)
            high, weight = min(low + 1, most), share - low
            out[t, b] = math.exp((1 - weight) * math.log(table[low, b]) + weight * math.log(table[high, b]))
    return out


def replay(tables: Tables, cores: int, **kwargs) -> Search:
    """The search run to its end, each point it asks for looked up in `tables`."""
    any_table = next(iter(tables.values()))
    search = Search(sorted({t for t, _ in any_table}), sorted({b for _, b in any_table}), tuple(tables),
                    cores=cores, **kwargs)
    while points := search.next_points():
        for runtime, t, b in points:
            search.record(runtime, t, b, tables[runtime][t, b])
    return search


def served_ratios(tables: Tables, measured: dict, cores: int) -> list[float]:
    """At each batch of the grid, the plan made from `measured` ((runtime, t, b) -> ms) over the plan
    made from every point, both served as the full tables say."""
    def planner(figures: dict) -> tuple[Planner, dict]:
        fastest: dict = {}
        for (runtime, t, b), ms in figures.items():
            fastest[t, b] = min(fastest.get((t, b), (math.inf, "")), (ms, runtime))
        return Planner([(t, b, ms) for (t, b), (ms, _) in fastest.items()], cores, BATCHES[-1]), fastest

    full, _ = planner({(r, t, b): ms for r, table in tables.items() for (t, b), ms in table.items()})
    partial, chosen = planner(measured)
    ratios = []
    for batch in BATCHES:
        instances = partial.plan(cores, batch).instances
        assert all((chosen[i.threads, i.batch][1], i.threads, i.batch) in measured for i in instances)
        ratios.append(max(tables[chosen[i.threads, i.batch][1]][i.threads, i.batch] for i in instances)
                      / full.table[cores, batch])
    return ratios


def worst_ratio(tables: Tables, measured: dict, cores: int) -> float:
    """The worst, over the grid's batches, of served_ratios."""
    return max(served_ratios(tables, measured, cores))


@needs_tables
@pytest.mark.parametrize("model", MODELS)
def test_the_search_measures_little_of_a_16_core_grid_and_plans_as_the_full_grid(model):
    tables = published(model)
    search = replay(tables, cores=16)
    assert search.grid_size == 288
    assert len(search.measured) <= 0.18 * 288  # 2.5 fit errors of hope (4 % run noise hid a 5 % dip at 2)
    assert worst_ratio(tables, search.measured, 16) <= 1.03
    assert set(search.measured.values()) <= {ms for table in tables.values() for ms in table.values()}


@needs_tables
@pytest.mark.parametrize("model", ["resnet", "bert"])
def test_the_measured_share_falls_as_the_grid_grows(model):
    tables = published(model)
    small = replay(tables, cores=16)
    big_tables = {runtime: stretched(table, 4) for runtime, table in tables.items()}
    big = replay(big_tables, cores=64)
    assert big.grid_size == 64 * len(BATCHES) * 3
    assert len(big.measured) / big.grid_size < len(small.measured) / small.grid_size
    assert worst_ratio(big_tables, big.measured, 64) <= 1.03


@needs_tables
def test_the_check_fails_plans_made_from_the_design_points_alone():
    """The oracle of the tests above can fail: the design points alone plan some B 1.5x too slow."""
    tables = published("resnet")
    designed = {(r, t, b): tables[r][t, b] for r in tables for t, b in design(list(range(1, 17)), list(BATCHES))}
    assert worst_ratio(tables, designed, 16) > 1.3


def ernest(theta: tuple[float, ...]) -> dict[tuple[int, int], float]:
    return {(t, b): theta[0] + theta[1] * b / t + theta[2] * b + theta[3] * t + theta[4] * math.log(t)
            for t in range(1, 9) for b in BATCHES}


def test_the_fit_predicts_a_table_of_its_own_form_from_the_design_points():
    table = ernest((2.0, 30.0, 1.5, 0.4, 0.0))
    search = Search(list(range(1, 9)), list(BATCHES), ("one",))
    for t, b in design(search.threads, search.batches):
        search.record("one", t, b, table[t, b])
    predicted = search._predict("one")
    for i, t in enumerate(search.threads):
        for j, b in enumerate(search.batches):
            assert predicted[i, j] == pytest.approx(table[t, b], rel=1e-6)


def test_a_runtime_slower_everywhere_is_measured_at_its_design_points_alone():
    fast = ernest((2.0, 30.0, 1.5, 0.4, 0.0))
    tables = {"fast": fast, "slow": {point: 2 * ms for point, ms in fast.items()}}
    search = replay(tables, cores=8)
    assert search.dropped() == ["slow"]
    assert {(t, b) for r, t, b in search.measured if r == "slow"} == set(design(list(range(1, 9)), list(BATCHES)))


def test_a_measured_point_far_faster_than_its_prediction_widens_the_hopes():
    """The fit's error is what it missed by on points measured after it, the misses on the fast
    side: a point found faster than predicted makes every unmeasured point more hopeful."""
    table = ernest((2.0, 30.0, 1.5, 0.4, 0.0))
    search = Search(list(range(1, 9)), list(BATCHES), ("one",))
    for t, b in design(search.threads, search.batches):
        search.record("one", t, b, table[t, b])
    before = search.fit_error()
    search.record("one", 2, 4, table[2, 4] * 0.7)
    assert search.fit_error() > before
    search.record("one", 3, 4, table[3, 4] * 1.5)  # a slow surprise does not
    assert search.errors[("one", 3, 4)] > 0


def test_record_refuses_a_latency_that_is_not_positive():
    with pytest.raises(ValueError, match="latency must be > 0"):
        Search([1, 2], [1, 2], ("one",)).record("one", 1, 1, 0.0)


def test_design_spans_the_threads_at_two_batches_and_leaves_the_largest_to_the_plans():
    points = design(list(range(1, 17)), list(BATCHES))
    assert sorted(points) == [(1, 1), (1, 8), (4, 1), (4, 8), (16, 1), (16, 8)]
    assert sorted(design([1, 2], [1, 2, 4, 8, 16, 32, 64])) == [(1, 1), (1, 8), (2, 1), (2, 8)]
    assert design([1], [1]) == [(1, 1)]


@needs_tables
@pytest.mark.parametrize("model", MODELS)
def test_a_costly_runtime_borrows_the_others_shape_and_still_plans_as_the_full_grid(model):
    tables = published(model)
    search = replay(tables, cores=16, costly=("glibc",))
    assert worst_ratio(tables, search.measured, 16) <= 1.03


def test_a_costly_runtime_slower_everywhere_is_measured_at_its_two_design_points_alone():
    fast = ernest((2.0, 30.0, 1.5, 0.4, 0.0))
    tables = {"fast": fast, "costly": {point: 1.2 * ms for point, ms in fast.items()}}
    search = replay(tables, cores=8, costly=("costly",))
    assert {(t, b) for r, t, b in search.measured if r == "costly"} == {(8, 1), (3, 8)}
    assert search.dropped() == ["costly"]
    assert search._predict("costly") == pytest.approx(search._predict("fast") * 1.2, rel=1e-6)


def test_a_spent_budget_asks_only_for_what_gives_every_batch_a_plan():
    fast = ernest((2.0, 30.0, 1.5, 0.4, 0.0))
    tables = {"fast": fast, "costly": {point: 0.9 * ms for point, ms in fast.items()}}
    search = Search(list(range(1, 3)), [1, 2, 4, 8, 16, 32, 64], tuple(tables), costly=("costly",))
    assert search.next_points(cover_only=True) == [("fast", t, b) for t, b in design(search.threads, search.batches)]
    while points := search.next_points(cover_only=True):
        assert all(runtime == "fast" for runtime, _, _ in points)  # no build while the budget is spent
        for runtime, t, b in points:
            search.record(runtime, t, b, tables[runtime][t, b])
    best, _ = search._planner(search.measured)
    assert all(best.table[2, b] < math.inf for b in search.batches)  # every batch of the grid has a plan
    assert search.next_points()  # while the search itself would measure more


def test_filled_items_keep_the_measured_and_fit_the_rest():
    """The node's items: a profile's chosen figures as they are, the fit's least figure where no
    runtime was measured (the node may plan a model on fewer cores than its search did)."""
    from packrat.profiling.search import filled_items

    def truth(t, b, slower=1.0):
        return slower * (2.0 + 30.0 * b / t + 0.5 * b)

    measured = [(1, 1), (2, 1), (4, 1), (1, 8), (2, 8), (4, 8), (4, 4), (2, 4)]  # ⟨1, 4⟩ never measured
    points = {(t, b, "fast"): truth(t, b) for t, b in measured}
    points |= {(t, b, "slow"): truth(t, b, 1.3) for t, b in measured}
    items = [(t, b, truth(t, b) * 1.01) for t, b in measured]  # the chosen runtime's, with its margin
    filled = {(t, b): ms for t, b, ms in filled_items(items, points, [1, 2, 3, 4], [1, 4, 8])}
    assert all(filled[t, b] == ms for t, b, ms in items)
    assert set(filled) == {(t, b) for t in (1, 2, 3, 4) for b in (1, 4, 8)}
    assert filled[1, 4] == pytest.approx(truth(1, 4), rel=0.05)  # the faster runtime's fit
    assert filled[3, 8] == pytest.approx(truth(3, 8), rel=0.05)
    assert filled_items(items, {}, [1, 2, 3, 4], [1, 4, 8]) == sorted(items)  # no fit: nothing added
