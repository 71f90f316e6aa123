"""Measuring IOS stage candidates on this CPU, the way the executor will run them, and the
bounds that let the search skip most of them.

A candidate is timed through the executor's own path (`ios_scheduler.candidates` makes its
calls: each group one generated function, handed to the runtime's pinned workers). A
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

from .candidates import Call, Key, StageCandidates
from .graph import Graph
from .runtime import WorkerSet, time_call

INF = float("inf")
BOUND_SLACK = 0.1  # a bound from another batch size is lowered by this share (timings are noisy)


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
    """Times the stage candidates of one graph (`candidates`: their calls) and keeps what it
    measured (`table`); gives the lower bounds that let the search skip a candidate."""

    def __init__(self, graph: Graph, env: dict, workers: WorkerSet, model: str, threads: int, batch: int,
                 warmup: int, repeats: int, bounds: CostTable | None = None):
        if bounds is not None and (bounds.model, bounds.threads) != (model, threads):
            raise ValueError(f"stage costs of {bounds.model} on {bounds.threads} threads cannot bound "
                             f"{model} on {threads}")
        self.candidates = StageCandidates(graph, env, workers, threads)
        self.graph, self.workers = graph, workers
        self.threads, self.batch = threads, batch
        self.warmup, self.repeats = warmup, repeats
        self.bounds = bounds
        self.measurements = 0
        self.table = CostTable(model, batch, threads)
        self._alone: dict[tuple[int, int], float] = {}
        self._handoff: dict[int, float] = {}
        self.switch: float | None = None  # measured at the first concurrent candidate

    # ---- candidates ----------------------------------------------------------------------------

    def _stage(self, kind: str, node_groups, split) -> "tuple[Call, float] | None":
        """(a call running the stage as the executor does, the switch cost it carries), or None
        where a merge is not possible."""
        run = self.candidates.stage(kind, node_groups, split)
        if run is None:
            return None
        concurrent = kind != "merge" and not self.candidates.full_width(node_groups, split)
        return run, (self.switch_cost() if concurrent else 0.0)

    def retime(self, plans) -> float:
        """The summed cost of a schedule's stages (StagePlans), each measured again now the way
        the search measures candidates. Taken right before the end-to-end check, it tells
        whether stage costs add up apart from how far the machine drifted during a long search."""
        total = 0.0
        for plan in plans:
            run, switch = self._stage(plan.kind, self.candidates.named(plan.groups), plan.threads)
            with torch.inference_mode():
                total += time_call(run, self.warmup, self.repeats) + switch
        return total

    def parallel(self, groups, split, limit: float = INF) -> float:
        run, switch = self._stage("parallel", [self.candidates.nodes_of(group) for group in groups], split)
        return self._time(self.candidates.key("parallel", groups, split), run, limit - switch) + switch

    def merge(self, ops, threads: int, limit: float = INF) -> float | None:
        stage = self._stage("merge", [self.candidates.nodes_of((op,)) for op in ops], (threads,))
        return None if stage is None else self._time(self.candidates.key("merge", (ops,), (threads,)), stage[0], limit)

    def _time(self, key: Key, fn, limit: float) -> float:
        self.measurements += 1
        with torch.inference_mode():
            ms = time_call(fn, self.warmup, self.repeats, limit)
        self.table.costs[key] = ms  # a median, or (stopped early) the fastest of the first runs: both bound it
        return ms

    def switch_cost(self, rounds: int = 31) -> float:
        """What a concurrent stage costs beyond its own time when it sits between full-width
        operators, as it does in a schedule, beyond what its operators one after another would
        cost there: the full-width team's threads still on the cores the stage's workers need,
        asleep when the next operator wants them, the workers' wake-ups. Measured once, in
        interleaved rounds (medians), as t(F then P) - t(F then Q) - t(P) + t(Q), where F is a
        full-width stretch of eight operators from the middle of the graph, P a stage of two
        groups, each one operator of median output size (typical of the stages the search weighs;
        larger ones would bury the switch in their own noise), and Q the same two operators one
        after another on every thread. t(F then P) - t(F) - t(P) alone (before issue 49) also
        counted the caches F leaves cold, which Q pays as much (Inception-v3 on 2 cores: P took
        0.68 ms alone and 0.99 after F, whatever GOMP_SPINCOUNT), and charged it to concurrency."""
        if self.switch is None:
            count = len(self.graph.ops)
            full = self.candidates.group(range(count // 2, min(count, count // 2 + 8)), 0)
            by_size = sorted(range(count), key=lambda op: _size(self.graph.ops[op].shape))
            ops = by_size[count // 2:count // 2 + 2] or by_size[:1]
            half = (max(1, self.threads // 2), max(1, self.threads - self.threads // 2))[:len(ops)]
            stage = self.candidates.on_workers([self.candidates.group((op,), 0) for op in ops], half)
            in_order = self.candidates.group(tuple(sorted(ops)), 0)
            cases = {"P": stage, "Q": in_order, "FP": lambda: (full(), stage()), "FQ": lambda: (full(), in_order())}
            samples: dict[str, list[float]] = {name: [] for name in cases}
            with torch.inference_mode():
                for _ in range(rounds):
                    for name, call in cases.items():
                        samples[name].append(time_call(call, 1, 1))
            median = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
            self.switch = max(0.0, median["FP"] - median["FQ"] - median["P"] + median["Q"])
        return self.switch

    # ---- bounds --------------------------------------------------------------------------------

    def lower_bound(self, kind: str, groups, split) -> float | None:
        bounds = []
        if self.bounds is not None:
            bounds.append(self.bounds.bound(self.candidates.key(kind, groups, split), self.batch))
        if kind == "parallel" and len(groups) > 1:
            bounds.append(max(self.alone_group(g, k) for g, k in zip(groups, split)))
        bounds = [b for b in bounds if b is not None]
        return max(bounds) if bounds else None

    def alone_group(self, group, threads: int) -> float:
        """What the group's operators cost one by one on `threads` cores with nothing beside them,
        as one hand-off: a floor for the group in any stage."""
        ops = [self.alone(self.candidates.offset + op, threads) for op in group]
        return sum(ops) - (len(ops) - 1) * self.handoff(threads)

    def alone(self, op: int, threads: int) -> float:
        """Operator `op` (numbered in the whole graph) alone on `threads` cores."""
        key = (op, threads)
        if key not in self._alone:
            run = self.candidates.on_workers([self.candidates.group((op,), 0)], (threads,))
            self.measurements += 1
            with torch.inference_mode():
                self._alone[key] = time_call(run, self.warmup, self.repeats)
        return self._alone[key]

    def handoff(self, threads: int) -> float:
        """The fixed cost of running nothing through the executor's path for one group."""
        if threads not in self._handoff:
            self._handoff[threads] = time_call(self.candidates.on_workers([lambda: None], (threads,)), 5, 21)
        return self._handoff[threads]


def _size(shape) -> int:
    return math.prod(shape) if shape else 0
