"""The IOS dynamic program: group a DAG's operators into stages, each stage's groups
running concurrently on disjoint threads. Pure: the DAG and a stage-cost function in,
the schedule out (the runtime measures real costs; tests use synthetic ones).

State: the set S of operators not scheduled yet (a bitmask). The last stage of S is an
*ending* E ⊆ S: no operator of E feeds one in S \\ E, so E can run after everything
else in S. cost(S) = min over endings E and stage candidates c of cost(S \\ E) + c(E).

Endings are enumerated directly as the successor-closed subsets of S of at most
`max_group_size · max_num_groups` operators: every such subset, including those whose
chains' closures overlap (the case the public IOS code misses), is reached by adding
one operator at a time whose successors in S are all already in the subset.

Stage candidates for an ending E:
- **parallel**: E's weakly connected components must each stay within one group (an
  edge inside a stage has to run in order); components are packed into at most
  `max_num_groups` groups of at most `max_group_size` operators, largest first onto the
  group with the least work; every split of the stage's threads over the groups is a
  candidate (on CPU the core share is part of the stage);
- **merge**: offered by the caller's `merge_cost` (e.g. convolutions reading the same
  tensor fused into one wider convolution); None where E cannot be merged.
The purely sequential schedule (one operator per stage, every thread) is always among
the candidates, so the result is never worse than it by the costs given.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Sequence

Groups = tuple[tuple[int, ...], ...]  # each group: operator indices in execution order


@dataclass(frozen=True)
class Stage:
    kind: str  # "parallel" or "merge"
    groups: Groups
    threads: tuple[int, ...]  # threads of each group (one entry for a merge stage)
    cost: float

    @property
    def ops(self) -> tuple[int, ...]:
        return tuple(op for group in self.groups for op in group)


@dataclass
class SearchResult:
    stages: list[Stage]
    cost: float
    states: int  # distinct op sets solved
    candidates: int  # stage candidates costed (each a measurement when costs are measured)
    sequential_cost: float = field(default=0.0)


StageCost = Callable[[Groups, tuple[int, ...]], float]
MergeCost = Callable[[tuple[int, ...], int], "float | None"]


def thread_splits(threads: int, groups: int) -> list[tuple[int, ...]]:
    """Every way to give each of `groups` groups ≥ 1 thread, using at most `threads`
    (a single group always gets them all). Fewer threads than groups: all groups share
    the threads as one (recorded as 1 each)."""
    if groups == 1:
        return [(threads,)]
    if threads < groups:
        return [(1,) * groups]
    return [split for split in itertools.product(range(1, threads - groups + 2), repeat=groups)
            if sum(split) == threads]


def _components(ops: Sequence[int], succ: Sequence[int]) -> list[tuple[int, ...]]:
    """Weakly connected components of the subgraph induced by ops, each in topological order."""
    members = set(ops)
    seen: set[int] = set()
    comps = []
    for start in sorted(ops):
        if start in seen:
            continue
        stack, comp = [start], []
        seen.add(start)
        while stack:
            op = stack.pop()
            comp.append(op)
            neighbours = [o for o in members if (succ[op] >> o) & 1 or (succ[o] >> op) & 1]
            for o in neighbours:
                if o not in seen:
                    seen.add(o)
                    stack.append(o)
        comps.append(tuple(sorted(comp)))  # indices are topologically ordered
    return comps


def _pack(components: list[tuple[int, ...]], max_groups: int, max_size: int) -> Groups | None:
    """Components into ≤ max_groups groups of ≤ max_size ops (largest first, smallest group
    first); None when a component alone is too big or they do not fit."""
    if any(len(c) > max_size for c in components):
        return None
    groups: list[list[int]] = []
    for comp in sorted(components, key=len, reverse=True):
        fitting = [g for g in groups if len(g) + len(comp) <= max_size]
        if len(groups) < max_groups:
            groups.append(list(comp))
        elif fitting:
            min(fitting, key=len).extend(comp)
        else:
            return None
    return tuple(tuple(sorted(g)) for g in groups)


class IOSSearch:
    """The DP for one part of a graph.

    succ[i] is the bitmask of operator i's successors; operators are numbered in a
    topological order (every edge goes from a lower to a higher index).
    """

    def __init__(self, succ: Sequence[int], threads: int, stage_cost: StageCost,
                 merge_cost: MergeCost | None = None, max_group_size: int = 3, max_num_groups: int = 8):
        for op, mask in enumerate(succ):
            if mask & ((1 << (op + 1)) - 1):
                raise ValueError(f"operator {op} has an edge to an earlier operator: number them topologically")
        self.succ, self.threads = list(succ), threads
        self.stage_cost, self.merge_cost = stage_cost, merge_cost
        self.max_group_size, self.max_num_groups = max_group_size, max_num_groups
        self.max_ending = max_group_size * max_num_groups
        self.candidates = 0
        self._stage_cache: dict[int, Stage] = {}

    # ---- endings ------------------------------------------------------------------------------

    def endings(self, state: int) -> list[int]:
        """Every non-empty successor-closed subset of `state` with at most max_ending ops."""
        ops = [op for op in range(len(self.succ)) if (state >> op) & 1]
        found: set[int] = set()
        frontier = {0}
        for _ in range(min(self.max_ending, len(ops))):
            grown = set()
            for ending in frontier:
                for op in ops:
                    bit = 1 << op
                    # op may join once all its successors still to be scheduled are in the ending
                    if not ending & bit and self.succ[op] & state & ~ending == 0:
                        grown.add(ending | bit)
            grown -= found
            found |= grown
            frontier = grown
            if not frontier:
                break
        return sorted(found)

    # ---- stage candidates ---------------------------------------------------------------------

    def best_stage(self, ending: int) -> Stage | None:
        """The cheapest way to run the ops of `ending` as one stage (cached by op set)."""
        if ending in self._stage_cache:
            return self._stage_cache[ending]
        ops = tuple(op for op in range(len(self.succ)) if (ending >> op) & 1)
        best: Stage | None = None
        groups = _pack(_components(ops, self.succ), self.max_num_groups, self.max_group_size)
        if groups is not None:
            for split in thread_splits(self.threads, len(groups)):
                self.candidates += 1
                cost = self.stage_cost(groups, split)
                if best is None or cost < best.cost:
                    best = Stage("parallel", groups, split, cost)
        if self.merge_cost is not None and len(ops) > 1:
            self.candidates += 1
            cost = self.merge_cost(ops, self.threads)
            if cost is not None and (best is None or cost < best.cost):
                best = Stage("merge", (ops,), (self.threads,), cost)
        self._stage_cache[ending] = best
        return best

    # ---- the DP -------------------------------------------------------------------------------

    def solve(self, progress: Callable[[int], None] | None = None) -> SearchResult:
        full = (1 << len(self.succ)) - 1

        @lru_cache(maxsize=None)
        def cost(state: int) -> tuple[float, int]:
            """(best cost of scheduling `state`, the last stage's ending)."""
            if state == 0:
                return 0.0, 0
            if progress:
                progress(1)
            best = (float("inf"), 0)
            for ending in self.endings(state):
                stage = self.best_stage(ending)
                if stage is None:
                    continue
                total = cost(state & ~ending)[0] + stage.cost
                if total < best[0]:
                    best = (total, ending)
            return best

        total, _ = cost(full)
        stages, state = [], full
        while state:
            _, ending = cost(state)
            stages.append(self.best_stage(ending))
            state &= ~ending
        stages.reverse()
        sequential = sum(self.stage_cost(((op,),), (self.threads,)) for op in range(len(self.succ)))
        return SearchResult(stages, total, cost.cache_info().currsize, self.candidates, sequential)
