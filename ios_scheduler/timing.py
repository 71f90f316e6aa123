"""Measuring IOS stage candidates on this CPU, the way the executor will run them, and the
bounds that let the search skip most of them.

A candidate is timed through the executor's own path: each group one generated function,
handed to the runtime's pinned workers (a full-width group runs on the calling thread). A
concurrent candidate also carries the cost of switching to it from full-width operators and
back (`switch_cost`, measured once per model), which timing it alone would miss.

Lower bounds (`StageTimer.lower_bound`), each used only to skip a candidate that could not
win even at its bound:
- **alone**: running beside other groups never makes a group faster than running alone on
  the same cores, so a stage costs at least its slowest group's operators timed one by one
  on that group's thread count (less the hand-offs a group pays once rather than per
  operator). Where intra-op threading scales well (large convolutions), one core running
  an operator takes about twice what two take, so a concurrent stage's bound already
  exceeds running its operators one by one on every thread and the candidate is never timed.
- **another batch size** (`bounds`, a CostTable from an earlier search of the same model):
  a candidate at batch b costs at least what it cost at a smaller batch, and at least
  b / b0 of what it cost at a larger batch b0 (a batch of b0 can always run as b0 / b runs
  of b), less a slack for noise.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import fx

from ios_scheduler.codegen import CompiledGroup, compile_group
from ios_scheduler.graph import Graph
from ios_scheduler.runtime import MergeStage, WorkerSet, time_call

INF = float("inf")
BOUND_SLACK = 0.1  # a bound from another batch size is lowered by this share (timings are noisy)

Key = tuple[str, tuple[tuple[str, ...], ...], tuple[int, ...]]  # kind, groups as node names, threads


@dataclass
class CostTable:
    """Stage costs measured for one model, batch size and thread count (medians, or for
    measurements stopped early the fastest of their first runs)."""

    model: str
    batch: int
    threads: int
    costs: dict[Key, float] = field(default_factory=dict)

    def to_json(self) -> str:
        rows = [[kind, [list(g) for g in groups], list(split), round(ms, 4)]
                for (kind, groups, split), ms in self.costs.items()]
        return json.dumps({"model": self.model, "batch": self.batch, "threads": self.threads, "costs": rows})

    @classmethod
    def from_json(cls, text: str) -> "CostTable":
        try:
            data = json.loads(text)
            costs = {(kind, tuple(tuple(g) for g in groups), tuple(split)): float(ms)
                     for kind, groups, split, ms in data["costs"]}
            return cls(str(data["model"]), int(data["batch"]), int(data["threads"]), costs)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not a stage cost table: {type(exc).__name__}: {exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> "CostTable":
        return cls.from_json(Path(path).read_text())

    def bound(self, key: Key, batch: int) -> float | None:
        """A lower bound on the candidate's cost at `batch`, or None where it was not measured."""
        ms = self.costs.get(key)
        if ms is None:
            return None
        scale = 1.0 if batch >= self.batch else batch / self.batch
        return ms * scale * (1 - BOUND_SLACK)


class StageTimer:
    """Times the stage candidates of one graph on the example input's values (`env`)."""

    def __init__(self, graph: Graph, env: dict, workers: WorkerSet, model: str, threads: int, batch: int,
                 warmup: int, repeats: int, bounds: CostTable | None = None):
        self.graph, self.env, self.workers = graph, env, workers
        self.threads, self.batch = threads, batch
        self.warmup, self.repeats = warmup, repeats
        if bounds is not None and (bounds.model, bounds.threads) != (model, threads):
            raise ValueError(f"stage costs of {bounds.model} on {bounds.threads} threads cannot bound "
                             f"{model} on {threads}")
        self.bounds = bounds
        self.nodes = {n.name: n for n in graph.module.graph.nodes}
        self.measurements = 0
        self.offset = 0  # the search numbers operators within the current part
        self.table = CostTable(model, batch, threads)
        self._compiled: dict[tuple[fx.Node, ...], CompiledGroup] = {}  # groups recur across candidates
        self._alone: dict[tuple[int, int], float] = {}
        self._handoff: dict[int, float] = {}
        self.switch: float | None = None  # measured at the first concurrent candidate

    # ---- candidates ----------------------------------------------------------------------------

    def nodes_of(self, ops, offset: int | None = None) -> list[fx.Node]:
        offset = self.offset if offset is None else offset
        return [self.nodes[name] for op in ops for name in self.graph.ops[offset + op].nodes]

    def key(self, kind: str, groups, split) -> Key:
        return kind, tuple(tuple(n.name for n in self.nodes_of(g)) for g in groups), tuple(split)

    def compiled(self, group, offset: int | None = None) -> CompiledGroup:
        """The group as the executor runs it: one generated function."""
        return self._compile(tuple(self.nodes_of(group, offset)))

    def _compile(self, nodes: tuple[fx.Node, ...]) -> CompiledGroup:
        if nodes not in self._compiled:
            self._compiled[nodes] = compile_group(self.graph.module, nodes)
        return self._compiled[nodes]

    def _stage(self, kind: str, node_groups, split) -> "tuple[object, float] | None":
        """(a call running the stage as the executor does, the switch cost it carries), or None
        where a merge is not possible."""
        if kind == "merge":
            merged = MergeStage.build(self.graph.module, node_groups)
            if merged is None:
                return None
            return (lambda: self.workers.run([lambda: merged(self.env)], split)), 0.0
        calls = [lambda g=self._compile(tuple(nodes)): g.run(self.env) for nodes in node_groups]
        full_width = len(node_groups) == 1 and tuple(split) == (self.threads,)  # fused with its neighbours
        return (lambda: self.workers.run(calls, split)), (0.0 if full_width else self.switch_cost())

    def retime(self, plans) -> float:
        """The summed cost of a schedule's stages (StagePlans), each measured again now the way
        the search measures candidates. Taken right before the end-to-end check, it tells
        whether stage costs add up apart from how far the machine drifted during a long search."""
        total = 0.0
        for plan in plans:
            run, switch = self._stage(plan.kind, [[self.nodes[name] for name in g] for g in plan.groups], plan.threads)
            with torch.inference_mode():
                total += time_call(run, self.warmup, self.repeats) + switch
        return total

    def parallel(self, groups, split, limit: float = INF) -> float:
        run, switch = self._stage("parallel", [self.nodes_of(group) for group in groups], split)
        return self._time(self.key("parallel", groups, split), run, limit - switch) + switch

    def merge(self, ops, threads: int, limit: float = INF) -> float | None:
        stage = self._stage("merge", [self.nodes_of((op,)) for op in ops], (threads,))
        return None if stage is None else self._time(self.key("merge", (ops,), (threads,)), stage[0], limit)

    def _time(self, key: Key, fn, limit: float) -> float:
        self.measurements += 1
        with torch.inference_mode():
            ms = time_call(fn, self.warmup, self.repeats, limit)
        self.table.costs[key] = ms  # a median, or (stopped early) the fastest of the first runs: both bound it
        return ms

    def switch_cost(self, rounds: int = 31) -> float:
        """What a concurrent stage costs beyond its own time when it sits between full-width
        operators, as it does in a schedule: the full-width team still spinning on the cores the
        stage's workers need, then asleep when the next operator wants it. Measured once, as
        t(F then P) - t(F) - t(P) in interleaved rounds (medians), where F is a full-width
        stretch of eight operators from the middle of the graph and P a stage of two groups,
        each one operator of median output size (typical of the stages the search weighs;
        larger ones would bury the switch in their own noise)."""
        if self.switch is None:
            count = len(self.graph.ops)
            stretch = self.compiled(range(count // 2, min(count, count // 2 + 8)), 0)
            by_size = sorted(range(count), key=lambda op: _size(self.graph.ops[op].shape))
            ops = by_size[count // 2:count // 2 + 2] or by_size[:1]
            half = (max(1, self.threads // 2), max(1, self.threads - self.threads // 2))[:len(ops)]
            pair = [lambda g=self.compiled((op,), 0): g.run(self.env) for op in ops]
            full = lambda: stretch.run(self.env)  # noqa: E731
            stage = lambda: self.workers.run(pair, half)  # noqa: E731
            samples: dict[str, list[float]] = {"F": [], "P": [], "FP": []}
            with torch.inference_mode():
                for _ in range(rounds):
                    samples["F"].append(time_call(full, 1, 1))
                    samples["P"].append(time_call(stage, 1, 1))
                    samples["FP"].append(time_call(lambda: (full(), stage()), 1, 1))
            median = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
            self.switch = max(0.0, median["FP"] - median["F"] - median["P"])
        return self.switch

    # ---- bounds --------------------------------------------------------------------------------

    def lower_bound(self, kind: str, groups, split) -> float | None:
        bounds = []
        if self.bounds is not None:
            bounds.append(self.bounds.bound(self.key(kind, groups, split), self.batch))
        if kind == "parallel" and len(groups) > 1:
            bounds.append(max(self.alone_group(g, k) for g, k in zip(groups, split)))
        bounds = [b for b in bounds if b is not None]
        return max(bounds) if bounds else None

    def alone_group(self, group, threads: int) -> float:
        """What the group's operators cost one by one on `threads` cores with nothing beside them,
        as one hand-off: a floor for the group in any stage."""
        ops = [self.alone(self.offset + op, threads) for op in group]
        return sum(ops) - (len(ops) - 1) * self.handoff(threads)

    def alone(self, op: int, threads: int) -> float:
        """Operator `op` (numbered in the whole graph) alone on `threads` cores."""
        key = (op, threads)
        if key not in self._alone:
            call = lambda g=self.compiled((op,), 0): g.run(self.env)  # noqa: E731
            self.measurements += 1
            with torch.inference_mode():
                self._alone[key] = time_call(lambda: self.workers.run([call], (threads,)), self.warmup, self.repeats)
        return self._alone[key]

    def handoff(self, threads: int) -> float:
        """The fixed cost of running nothing through the executor's path for one group."""
        if threads not in self._handoff:
            self._handoff[threads] = time_call(lambda: self.workers.run([lambda: None], (threads,)), 5, 21)
        return self._handoff[threads]


def _size(shape) -> int:
    return math.prod(shape) if shape else 0
