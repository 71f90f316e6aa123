"""optimize(): capture, search with measured stage costs, check end to end; compile(): run a schedule."""

from __future__ import annotations

import os
import random
import time
from typing import Sequence

import torch
from torch import fx, nn
from tqdm import tqdm

from .candidates import example_values
from .graph import Graph, capture, trace  # noqa: F401 (capture and trace are part of the API)
from .runtime import ScheduledModule, WorkerSet, caller_threads, time_call
from .schedule import Schedule, StagePlan
from .search import IOSSearch, Stage, concurrency_room
from .timing import CostTable, StageTimer

# Parts are cut at single-tensor bottlenecks, so a bound of 12 loses little: Inception-v3 has
# 1216 states with it against 1208 with 40, but 12,700 stage candidates against 118,992.
# RandWire and NASNet-A (741 and 625 operators, few bottlenecks) need the bound to finish.
DEFAULT_MAX_PART_SIZE = 12
# A candidate is measured against the best known alternative for its operators; its measurement
# stops after the first runs once their fastest is this far above it (timings are noisy).
PRUNE_MARGIN = 0.05
# The searched schedule is kept only when it runs clearly faster end to end than plain
# PyTorch: a tie within the timing noise would buy worker threads and risk for nothing.
KEEP_MARGIN = 0.02


def _stage_plan(graph: Graph, part: range, stage: Stage) -> StagePlan:
    def names(ops):
        return tuple(name for op in ops for name in graph.ops[part.start + op].nodes)

    cost = round(stage.cost, 4)
    if stage.kind == "merge":  # one group per merged operator: its convolution, then its tail
        return StagePlan("merge", tuple(names((op,)) for op in stage.groups[0]), stage.threads, cost)
    return StagePlan(stage.kind, tuple(names(group) for group in stage.groups), stage.threads, cost)


def sequential_schedule(graph: Graph, threads: int, batch: int, model: str, costs: CostTable | None = None) -> Schedule:
    """One operator per stage with every thread: what plain PyTorch does (with each stage's
    measured cost where `costs` has it)."""
    def cost(op):
        return costs.costs.get(("parallel", (op.nodes,), (threads,))) if costs is not None else None

    return Schedule(model, batch, threads, [StagePlan("parallel", (op.nodes,), (threads,), cost(op)) for op in graph.ops])


def greedy_schedule(graph: Graph, threads: int, batch: int, model: str) -> Schedule:
    """Every ready operator at once: stages are the graph's topological levels, threads shared evenly."""
    level: list[int] = []
    for op in graph.ops:
        level.append(1 + max((level[i] for i in op.inputs), default=-1))
    stages = []
    for depth in range(max(level, default=-1) + 1):
        ops = [op.nodes for op, d in zip(graph.ops, level) if d == depth]
        share = [threads // len(ops) + (1 if i < threads % len(ops) else 0) or 1 for i in range(len(ops))]
        stages.append(StagePlan("parallel", tuple(ops), tuple(share)))
    return Schedule(model, batch, threads, stages)


def optimize(module: nn.Module, example_inputs: Sequence[torch.Tensor] | torch.Tensor, threads: int | None = None,
             max_group_size: int = 3, max_num_groups: int = 8, max_part_size: int = DEFAULT_MAX_PART_SIZE,
             warmup: int = 1, repeats: int = 5, progress: bool = True, name: str | None = None,
             bounds: CostTable | None = None, check: bool = True, budget_s: float | None = None) -> Schedule:
    """Search an IOS schedule for `module` on this CPU at the example's batch size.

    `bounds`: the stage costs of an earlier search of the same model and thread count at
    another batch size (`schedule.costs` of its result), used to skip candidates.
    `check`: run the searched schedule and the sequential one end to end and keep the searched
    one only if it is clearly (KEEP_MARGIN) faster (off: the searched schedule as it is, e.g.
    to study its stage costs).
    `budget_s`: search the parts where concurrency could save most first (`concurrency_room`), and
    once this many seconds have passed, run the parts left one operator after another (the
    search's report counts them: `unsearched_parts`). The end-to-end check comes on top. On one
    thread no part is searched: groups side by side on one core never run faster."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    threads = threads or len(os.sched_getaffinity(0))
    model = name or type(module).__name__
    started = time.perf_counter()
    graph = capture(module.eval(), example_inputs)
    with caller_threads(threads):
        workers = WorkerSet(sorted(os.sched_getaffinity(0))[:threads])
        timer = StageTimer(graph, example_values(graph, example_inputs), workers, model, threads,
                           example_inputs[0].shape[0], warmup, repeats, bounds)
        try:
            # on one thread nothing can run side by side: every part stays sequential, unsearched
            budget_s = 0.0 if threads == 1 else budget_s
            schedule = _search(graph, timer, max_group_size, max_num_groups, max_part_size, progress,
                               None if budget_s is None else started + budget_s)
            sequential = sequential_schedule(graph, threads, schedule.batch, model, timer.table)
            if check:  # both schedules' stage costs again, next to their whole runs
                schedule.search.update(retimed_ios_ms=round(timer.retime(schedule.stages), 3),
                                       retimed_sequential_ms=round(timer.retime(sequential.stages), 3))
        finally:
            workers.close()
        if check:
            ios_ms, sequential_ms = compare(graph.module, [schedule, sequential], example_inputs)
            kept = "searched" if ios_ms < sequential_ms * (1 - KEEP_MARGIN) else "sequential"
            schedule.search.update(ios_ms=ios_ms, sequential_ms=sequential_ms, kept=kept)
            if kept == "sequential":  # the end-to-end measurement has the last word
                schedule.stages = sequential.stages
    schedule.search.update(seconds=round(time.perf_counter() - started, 2), budget_s=budget_s,
                           complete=schedule.complete)
    return schedule


def _search(graph: Graph, timer: StageTimer, max_group_size: int, max_num_groups: int, max_part_size: int,
            progress: bool, deadline: float | None = None) -> Schedule:
    """The DP part by part, with the timer's measured costs; with a `deadline` (perf_counter), the
    parts with most room for concurrency first, and those left at the deadline sequential."""
    totals = dict.fromkeys(("states", "stopped_early", "skipped", "confirmed", "predicted_ios_ms",
                            "predicted_sequential_ms", "unsearched_parts"), 0)
    parts = graph.parts(max_part_size)
    found: dict[int, list[StagePlan]] = {}
    with tqdm(total=len(graph), desc="IOS search", unit="op", disable=not progress) as bar:
        for index in _part_order(graph, parts, timer) if deadline is not None else range(len(parts)):
            part = parts[index]
            if deadline is not None and time.perf_counter() > deadline:
                found[index] = _unsearched(graph, part, timer, totals)
            else:
                found[index] = _search_part(graph, part, timer, max_group_size, max_num_groups, totals)
            bar.set_postfix(states=totals["states"], measured=timer.measurements)
            bar.update(len(part))
    stages = [plan for index in range(len(parts)) for plan in found[index]]
    schedule = Schedule(timer.table.model, timer.batch, timer.threads, stages, costs=timer.table)
    schedule.search = {**{k: round(v, 3) for k, v in totals.items()}, "measurements": timer.measurements,
                       "parts": len(parts), "operators": len(graph),
                       "switch_ms": None if timer.switch is None else round(timer.switch, 4)}
    return schedule


def _search_part(graph: Graph, part: range, timer: StageTimer, max_group_size: int, max_num_groups: int,
                 totals: dict) -> list[StagePlan]:
    """One part's stages by the DP, its figures added to `totals`."""
    timer.candidates.offset = part.start
    search = IOSSearch(graph.part_succ(part), timer.threads, timer.parallel, timer.merge, max_group_size,
                       max_num_groups, lower_bound=timer.lower_bound, margin=PRUNE_MARGIN, confirm=True)
    result = search.solve()
    for key, value in zip(totals, (result.states, result.stopped, result.skipped, result.confirmed,
                                   result.cost, result.sequential_cost)):
        totals[key] += value
    return [_stage_plan(graph, part, stage) for stage in result.stages]


def _unsearched(graph: Graph, part: range, timer: StageTimer, totals: dict) -> list[StagePlan]:
    """A part left at the deadline: its operators one after another on every thread, at their
    costs alone (which ordering the parts measured)."""
    costs = [timer.alone(op, timer.threads) for op in part]
    totals["unsearched_parts"] += 1
    totals["predicted_ios_ms"] += sum(costs)
    totals["predicted_sequential_ms"] += sum(costs)
    return [StagePlan("parallel", (graph.ops[op].nodes,), (timer.threads,), round(cost, 4))
            for op, cost in zip(part, costs)]


def _part_order(graph: Graph, parts: list[range], timer: StageTimer) -> list[int]:
    """The parts, those whose operators concurrency could save most on first (concurrency_room of
    their costs alone on every thread); a chain, with no room, last."""
    def room(part: range) -> float:
        return concurrency_room(graph.part_succ(part), [timer.alone(op, timer.threads) for op in part])

    rooms = [room(part) for part in parts]
    return sorted(range(len(parts)), key=lambda index: -rooms[index])


def compare(gm: fx.GraphModule, schedules: Sequence[Schedule], example_inputs: tuple, warmup: int = 3,
            repeats: int = 21) -> list[float]:
    """Median latency (ms) of each schedule, measured in interleaved rounds in shuffled order."""
    modules = [ScheduledModule(gm, s) for s in schedules]
    try:
        samples: list[list[float]] = [[] for _ in modules]
        with torch.inference_mode(), caller_threads(schedules[0].threads):
            for module in modules:
                for _ in range(warmup):
                    module(*example_inputs)
            order, shuffle = list(range(len(modules))), random.Random(0).shuffle
            for _ in range(repeats):  # a new order each round: no module always runs after the same one
                shuffle(order)
                for i in order:
                    samples[i].append(time_call(lambda m=modules[i]: m(*example_inputs), 0, 1))
    finally:
        for module in modules:
            module.close()
    return [sorted(s)[len(s) // 2] for s in samples]


def compile(module: nn.Module, schedule: Schedule, example_inputs=None) -> ScheduledModule:  # noqa: A001
    """`module` run by `schedule` (callable like the original). With example inputs, warns when
    their batch size differs from the one the schedule was found for."""
    if example_inputs is not None:
        first = example_inputs if isinstance(example_inputs, torch.Tensor) else example_inputs[0]
        schedule.check_for(first.shape[0], schedule.threads)
    return ScheduledModule(trace(module), schedule)
