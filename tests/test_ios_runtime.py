"""IOS runtime, schedules and the optimize/compile API on real (small) models."""

from __future__ import annotations

import json
import os
import threading
import warnings

import pytest
import torch
from torch import fx, nn

from packrat import ios_scheduler
from packrat.ios_scheduler.api import greedy_schedule, sequential_schedule
from packrat.ios_scheduler.graph import capture
from packrat.ios_scheduler.runtime import MergedConv, ScheduledModule, WorkerSet, caller_threads, mergeable
from packrat.ios_scheduler.schedule import Schedule, StagePlan
from packrat.models.zoo import ZOO, resolve
from packrat.models.inception import InceptionA, InceptionE
from model_checks import marked

CORES = sorted(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    return InceptionE(32).eval(), torch.randn(1, 32, 8, 8)


def expected(module, *x):
    with torch.inference_mode():
        return module(*x)


def assert_runs_like(compiled, module, x, rtol=1e-4, atol=1e-5):
    """The compiled module gives the original's outputs; its workers are stopped afterwards."""
    try:
        with torch.inference_mode():
            inputs = x if isinstance(x, tuple) else (x,)
            torch.testing.assert_close(compiled(*inputs), expected(module, *inputs), rtol=rtol, atol=atol)
    finally:
        compiled.close()


def test_json_round_trip_and_batch_warning():
    schedule = Schedule("m", 4, 2, [StagePlan("parallel", (("a",), ("b", "c")), (1, 1)),
                                    StagePlan("merge", (("d", "e"),), (2,))], {"states": 3})
    again = Schedule.from_json(schedule.to_json())
    assert again == schedule
    with pytest.warns(UserWarning, match="found for batch 4 and 2 threads, used for batch 1"):
        again.check_for(1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again.check_for(4, 2)
    with pytest.raises(ValueError, match="not a schedule"):
        Schedule.from_json('{"stages": 1}')


@pytest.mark.parametrize("bias", [True, False])
def test_merged_convolution_equals_the_separate_ones(bias):
    torch.manual_seed(1)
    convs = [nn.Conv2d(8, 4, 1, bias=bias), nn.Conv2d(8, 6, 3, padding=1, bias=bias),
             nn.Conv2d(8, 5, 5, padding=2, bias=bias), nn.Conv2d(8, 3, (1, 3), padding=(0, 1), bias=bias)]
    assert mergeable(convs)
    x = torch.randn(2, 8, 9, 9)
    with torch.inference_mode():
        for got, conv in zip(MergedConv(convs)(x), convs):
            torch.testing.assert_close(got, conv(x), rtol=1e-4, atol=1e-5)


def test_unmergeable_convolutions():
    assert not mergeable([nn.Conv2d(8, 4, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1, stride=2)])
    assert not mergeable([nn.Conv2d(8, 4, 3, padding=0), nn.Conv2d(8, 4, 1)])  # not 'same' padding
    assert not mergeable([nn.Conv2d(8, 4, 2, padding=1), nn.Conv2d(8, 4, 1)])  # even kernel
    assert not mergeable([nn.Conv2d(8, 4, 1)])


def test_sequential_and_greedy_schedules_give_the_same_outputs(block):
    module, x = block
    graph = capture(module, (x,))
    gm = graph.module  # the graph as IOS runs it (trace): what its schedules name
    for schedule in (sequential_schedule(graph, len(CORES), 1, "e"), greedy_schedule(graph, len(CORES), 1, "e")):
        assert_runs_like(ScheduledModule(gm, schedule), module, x)


@pytest.mark.slow
def test_optimize_then_compile_equals_the_original():
    torch.manual_seed(2)
    module, x = InceptionA(16, 8).eval(), torch.randn(1, 16, 8, 8)
    schedule = ios_scheduler.optimize(module, x, threads=len(CORES), repeats=2, warmup=1, progress=False)
    search = schedule.search
    assert search["states"] > 0 and search["measurements"] > 0 and search["operators"] > 0
    if search["kept"] == "sequential":  # the searched schedule was not clearly faster by its own measurements
        assert all(len(s.groups) == 1 and s.threads == (len(CORES),) for s in schedule.stages)
    else:
        assert search["ios_ms"] < search["sequential_ms"]
    compiled = ios_scheduler.compile(module, Schedule.from_json(schedule.to_json()), x)
    try:
        for batch in (1, 3):
            y = torch.randn(batch, 16, 8, 8)
            with torch.inference_mode():
                torch.testing.assert_close(compiled(y), expected(module, y), rtol=1e-4, atol=1e-5)
    finally:
        compiled.close()


def test_a_search_past_its_budget_leaves_the_parts_left_sequential(block):
    """With no time at all, every part runs one operator after another, costed, and counted."""
    module, x = block
    schedule = ios_scheduler.optimize(module, x, threads=len(CORES), progress=False, check=False, budget_s=0,
                                      max_part_size=4)
    search = schedule.search
    assert search["unsearched_parts"] == search["parts"] > 1 and search["states"] == 0
    assert all(len(s.groups) == 1 and s.threads == (len(CORES),) and s.cost > 0 for s in schedule.stages)
    assert search["predicted_ios_ms"] == search["predicted_sequential_ms"] > 0
    assert search["budget_s"] == 0 and search["complete"] is False and not schedule.complete
    assert_runs_like(ios_scheduler.compile(module, schedule), module, x)
    # one thread has nothing to run side by side: no part is searched, whatever the budget
    alone = ios_scheduler.optimize(module, x, threads=1, progress=False, check=False, max_part_size=4)
    assert alone.search["unsearched_parts"] == alone.search["parts"] and alone.search["states"] == 0
    assert alone.complete  # nothing was left to search
    # in time, the parts are searched in order of their room for concurrency, then put back in the graph's
    schedule = ios_scheduler.optimize(module, x, threads=len(CORES), progress=False, check=False, budget_s=1e6,
                                      max_part_size=4)
    assert schedule.search["unsearched_parts"] == 0 and schedule.search["states"] > 0
    assert schedule.search["complete"] is True and schedule.search["budget_s"] == 1e6
    assert_runs_like(ios_scheduler.compile(module, schedule), module, x)


def test_workers_are_pinned_with_their_thread_count():
    workers = WorkerSet(CORES)
    try:
        seen = workers.run([lambda: (sorted(os.sched_getaffinity(0)), torch.get_num_threads())] * len(CORES),
                           [1] * len(CORES))
        assert seen == [([c], 1) for c in CORES]
    finally:
        workers.close()


def test_a_full_width_stage_runs_on_the_calling_thread():
    """A worker team beside the caller's would push libgomp past its CPU count (runtime docstring)."""
    workers = WorkerSet(CORES)
    try:
        (ident,) = workers.run([threading.get_ident], [len(CORES)])
        assert ident == threading.get_ident()
        assert len(CORES) == 1 or threading.get_ident() not in workers.run([threading.get_ident] * 2, [1, 1])
    finally:
        workers.close()


def test_a_caller_with_other_threads_than_the_schedule_is_warned(block):
    module, x = block
    graph = capture(module, (x,))
    compiled = ScheduledModule(graph.module, greedy_schedule(graph, len(CORES), 1, "block"))
    with caller_threads(len(CORES) + 1), pytest.warns(UserWarning, match="full-width stages"):
        assert_runs_like(compiled, module, x)


def test_a_schedule_must_cover_the_graph(block):
    module, x = block
    gm = fx.symbolic_trace(module)
    with pytest.raises(ValueError, match="does not cover the graph"):
        ScheduledModule(gm, Schedule("e", 1, 1, [StagePlan("parallel", (("conv",),), (1,))]))


@pytest.mark.parametrize("name", marked(list(ZOO), pytest.mark.slow, set(ZOO) - {"tiny", "tiny_text", "squeezenet"}))
def test_zoo_networks_run_by_a_greedy_schedule_equal_the_original(name):
    spec = resolve(name)
    module, x = spec.build(), spec.example_inputs(1)
    graph = capture(module, x)
    compiled = ScheduledModule(graph.module, greedy_schedule(graph, len(CORES), 1, name))
    assert_runs_like(compiled, module, x, rtol=1e-3, atol=1e-4)


def test_a_merge_stage_in_a_compiled_block_equals_the_original():
    torch.manual_seed(3)
    module, x = InceptionA(16, 8).eval(), torch.randn(2, 16, 8, 8)
    graph = capture(module, (x,))
    sources = [op for op in graph.ops if not op.inputs]
    convs = [op for op in sources if op.target == "conv2d"]
    assert len(convs) >= 2
    merged = StagePlan("merge", tuple(op.nodes for op in convs), (len(CORES),))
    rest = [StagePlan("parallel", (op.nodes,), (len(CORES),)) for op in graph.ops if op not in convs]
    compiled = ScheduledModule(graph.module, Schedule("a", 2, len(CORES), [merged] + rest))
    assert_runs_like(compiled, module, x)


@pytest.mark.slow
def test_optimize_over_several_parts_measures_the_right_operators():
    torch.manual_seed(4)
    x = torch.randn(1, 16, 8, 8)
    first = InceptionA(16, 8).eval()
    with torch.inference_mode():
        channels = first(x).shape[1]
    module = nn.Sequential(first, InceptionA(channels, 8)).eval()
    schedule = ios_scheduler.optimize(module, x, threads=len(CORES), max_part_size=8, repeats=1, warmup=0,
                                      progress=False)
    assert schedule.search["parts"] > 2
    assert_runs_like(ios_scheduler.compile(module, schedule), module, x)


@pytest.mark.integration
def test_the_ios_runtime_in_the_profiler_and_the_pool(tmp_path):
    """ios is a runtime: measured beside inductor (its schedule searched once, kept), chosen per point,
    and run by a pool instance planned with it."""
    from packrat.profiling import profiler
    from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request
    from packrat.serving.pool.instance_pool import InstancePool
    from packrat.profiling.profiles import load

    cache = tmp_path / "schedules"
    settings = profiler.ProfileSettings(model="tiny", warmup=1, iters=3, ios_cache=str(cache), served=False,
                                        graph_mode="script")
    out = tmp_path / "tiny.csv"
    profile = profiler.run(settings, [1], [2], out, progress=False, runtimes=("inductor", "ios"), every_runtime=True)
    assert set(profile.by_runtime) == {"inductor", "ios"} and profile.metadata["mode"] != "ios"
    assert (cache / "tiny-t1-b2.json").exists()  # searched once, kept for the pool
    profiler.run(settings, [1], [2], out, progress=False, runtimes=("inductor", "ios"), every_runtime=True)
    assert len(load(out).rows) == 2  # resumed: nothing measured again
    spec = resolve("tiny")
    module, x = spec.build(), spec.example_input(4)
    config = InstanceConfig(1, 2, (CORES[0],), runtime="ios")
    with InstancePool(ModelConfig("tiny", ios_cache=str(cache)), [config]) as pool:
        assert pool.mode == "ios"
        v2 = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.flatten().tolist()}]}
        (answer,) = pool.infer([Request(json.dumps(v2).encode(), "application/json")])  # KServe v2: raw outputs
        output = json.loads(answer.body)["outputs"][0]
        got = torch.tensor(output["data"]).view(output["shape"])
        torch.testing.assert_close(got, expected(module, x), rtol=1e-4, atol=1e-5)


@pytest.mark.integration
def test_the_search_measures_ios_where_it_measured_the_others(tmp_path):
    from packrat.profiling import profiler

    settings = profiler.ProfileSettings(model="tiny", warmup=1, iters=3, ios_cache=str(tmp_path / "s"), served=False,
                                        graph_mode="script")
    done = profiler.search_profile(settings, [1], [1, 2], tmp_path / "tiny.csv", progress=False,
                                   runtimes=("inductor", "ios"), every_runtime=True)
    profile = done.profile
    assert set(profile.by_runtime["ios"]) == set(profile.by_runtime["inductor"])  # every runtime everywhere


def test_a_schedule_kept_for_another_graph_is_searched_again(tmp_path):
    """A cached schedule naming nodes the graph no longer has (an older packrat's) is replaced."""
    from packrat.ios_scheduler.cache import prepare_ios, schedule_path

    spec = resolve("tiny")
    stale = Schedule("tiny", 1, 1, [StagePlan("parallel", (("gone",),), (1,))])
    path = schedule_path(tmp_path, "tiny", 1, 1)
    path.write_text(stale.to_json())
    with caller_threads(1):
        compiled, examples, mode = prepare_ios(spec, 1, 1, tmp_path)
    try:
        assert mode == "ios" and "gone" not in path.read_text()
        with torch.inference_mode():
            torch.testing.assert_close(compiled(*examples), expected(spec.build(), *examples), rtol=1e-4, atol=1e-5)
    finally:
        compiled.close()


def test_a_profile_taken_whole_with_ios_holds_the_ios_runtime(tmp_path):
    """Files written before IOS was a runtime (`# mode: ios`) plan IOS instances as they did."""
    from packrat.profiling.profiles import load

    path = tmp_path / "old.csv"
    path.write_text("# model: tiny\n# mode: ios\nthreads,batch,latency_ms\n1,1,2.0\n1,2,3.0\n")
    assert set(load(path).runtimes.values()) == {"ios"}


def test_values_are_dropped_after_their_last_reader(block):
    module, x = block
    graph = capture(module, (x,))
    schedule = greedy_schedule(graph, len(CORES), 1, "block")
    compiled = ScheduledModule(graph.module, schedule)
    try:
        stage_of = {name: i for i, s in enumerate(schedule.stages) for g in s.groups for name in g}
        released = {node: i for i, nodes in enumerate(compiled._release) for node in nodes}
        outputs = {n for n in graph.module.graph.nodes if any(u.op == "output" for u in n.users)}
        computed = {n for n in graph.module.graph.nodes if n.op != "output"}
        assert set(released) == computed - outputs and len(released) == sum(map(len, compiled._release))
        for node, i in released.items():
            readers = [stage_of[user.name] for user in node.users]
            assert i == (max(readers) if readers else stage_of[node.name])  # right after the last reader
    finally:
        compiled.close()
