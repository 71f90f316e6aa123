"""The schedule cache: searched once, stage costs kept, later batch sizes bounded by them."""

from __future__ import annotations

from packrat.ios_scheduler import cache
from packrat.ios_scheduler.timing import CostTable
from packrat.models.zoo import resolve


def test_each_search_keeps_its_costs_and_the_next_batch_size_is_bounded_by_the_nearest(tmp_path, monkeypatch):
    spec = resolve("tiny")
    seen = []
    optimize = cache.optimize

    def recording(*args, **kwargs):
        seen.append(kwargs["bounds"])
        return optimize(*args, repeats=2, **kwargs)

    monkeypatch.setattr(cache, "optimize", recording)
    for batch in (1, 8, 2):
        cache.cached_schedule(spec.build(), spec.example_inputs(batch), "tiny", 2, tmp_path)
    assert seen[0] is None and seen[1].batch == 1 and seen[2].batch == 1  # 2 is nearer 1 than 8
    for batch in (1, 8, 2):
        table = CostTable.load(cache.costs_path(tmp_path, "tiny", 2, batch))
        assert (table.model, table.batch, table.threads) == ("tiny", batch, 2) and table.costs
    cache.cached_schedule(spec.build(), spec.example_inputs(2), "tiny", 2, tmp_path)
    assert len(seen) == 3  # found in the cache, not searched again


def test_damaged_or_foreign_tables_give_no_bounds(tmp_path):
    (tmp_path / "costs").mkdir()
    cache.costs_path(tmp_path, "tiny", 2, 4).write_text("not json")
    cache.costs_path(tmp_path, "tiny", 2, 8).write_text(CostTable("tiny", 8, 4).to_json())  # other threads
    assert cache.nearest_costs(tmp_path, "tiny", 2, 1) is None


def test_a_schedule_cut_short_is_searched_again_where_time_allows_and_never_shipped(tmp_path, monkeypatch):
    """A schedule whose search left parts unsearched is kept (an instance starts on it), searched again
    with `finish` (a profile point's search), replaced only by one that left fewer, and not packed
    into an archive as final."""
    from packrat.deploy.archive import cached_schedules
    from packrat.ios_scheduler.schedule import Schedule

    spec = resolve("tiny")
    left = iter([3, 5, 0])  # parts each search leaves unsearched

    def searching(module, examples, threads, **kwargs):
        parts = next(left)
        found = Schedule("tiny", examples[0].shape[0], threads, [], {"unsearched_parts": parts, "parts": 6})
        found.costs = CostTable("tiny", examples[0].shape[0], threads)
        return found

    monkeypatch.setattr(cache, "optimize", searching)
    first = cache.cached_schedule(spec.build(), spec.example_inputs(2), "tiny", 2, tmp_path)
    assert not first.complete and cached_schedules("tiny", tmp_path) == []
    assert cache.cached_schedule(spec.build(), spec.example_inputs(2), "tiny", 2, tmp_path).search == first.search
    worse = cache.cached_schedule(spec.build(), spec.example_inputs(2), "tiny", 2, tmp_path, finish=True)
    assert worse.search["unsearched_parts"] == 3  # the new search left 5: the kept one stays
    done = cache.cached_schedule(spec.build(), spec.example_inputs(2), "tiny", 2, tmp_path, finish=True)
    assert done.complete and cached_schedules("tiny", tmp_path) == [cache.schedule_path(tmp_path, "tiny", 2, 2)]
    assert cache.cached_schedule(spec.build(), spec.example_inputs(2), "tiny", 2, tmp_path, finish=True).complete
