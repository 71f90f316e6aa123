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
  group with the least work; the stage's threads are split over the groups (on CPU the core
  share is part of the stage): every split where there are few (EXHAUSTIVE_SPLITS: all of them
  on 2 and 4 threads), else the split in proportion to the groups' work (each operator alone on
  every thread, measured anyway for the sequential schedule) and the even one. Every split was
  1,247,070 candidates for Inception-v3 at batch 1 on 16 threads, against 6,416 on 2 (issue 49);
- **merge**: offered by the caller's `merge_cost` (e.g. convolutions reading the same
  tensor fused into one wider convolution); None where E cannot be merged.
The purely sequential schedule (one operator per stage, every thread) is always among
the candidates, so the result is never worse than it by the costs given.

Pruning (`prune=True`, the default) measures fewer candidates and finds the same schedule
whenever costs are exact and add up (tests/test_ios_search.py checks it):
- **redundant endings**: an ending that is one connected component can only be one group
  on every thread, which the executor runs exactly as it runs those operators one stage
  each (consecutive full-width stages are fused), so it is not a candidate;
- **the best known alternative**: E's operators can always run one by one at the end of S,
  and S has a best schedule found so far. A candidate is measured against the cheaper of
  the two (and of E's best candidate so far); the cost function may stop after its first
  runs once the candidate is clearly above that limit and return its estimate, which the
  search keeps and measures in full only where it could win;
- **bounds**: an optional `lower_bound` (e.g. from the same candidate measured at another
  batch size) skips a candidate, unmeasured, where even its bound cannot win.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

Groups = tuple[tuple[int, ...], ...]  # each group: operator indices in execution order
INF = float("inf")
# Up to this many ways to split a stage's threads over its groups, every one is a candidate (all of
# them on 2 and 4 threads); beyond, two: in proportion to the groups' work, and even (thread_splits).
EXHAUSTIVE_SPLITS = 10


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
    stopped: int = 0  # of those, costed only up to their limit (measurements stopped after their first runs)
    skipped: int = 0  # candidates never measured: their lower bound could not win
    confirmed: int = 0  # chosen stages measured a second time


# Cost functions get the candidate and a limit: above the limit, any figure above it will do
# (a measurement may stop after its first runs and return its estimate); None: not possible.
StageCost = Callable[[Groups, tuple[int, ...], float], float]
MergeCost = Callable[[tuple[int, ...], int, float], "float | None"]
LowerBound = Callable[[str, Groups, tuple[int, ...]], "float | None"]
Candidate = tuple[str, Groups, tuple[int, ...]]  # kind, groups, threads


def thread_splits(threads: int, groups: int, work: Sequence[float] | None = None,
                  exhaustive: int = EXHAUSTIVE_SPLITS) -> list[tuple[int, ...]]:
    """The ways to give each of `groups` groups ≥ 1 thread, using all `threads` (a single group
    always gets them all; fewer threads than groups: all groups share the threads as one,
    recorded as 1 each). Every such split while there are at most `exhaustive` of them, or when
    the groups' `work` is not known; beyond, the split in proportion to the work (the one whose
    groups finish together when threads scale perfectly) and the even one: the count of splits
    grows as C(T - 1, g - 1), 6,435 for 8 groups on 16 threads."""
    if groups == 1:
        return [(threads,)]
    if threads < groups:
        return [(1,) * groups]
    if work is None or math.comb(threads - 1, groups - 1) <= exhaustive:
        return [split for split in itertools.product(range(1, threads - groups + 2), repeat=groups)
                if sum(split) == threads]
    even = [1.0] * groups
    return list(dict.fromkeys([_apportion(threads, work), _apportion(threads, even, order=work)]))


def concurrency_room(succ: Sequence[int], costs: Sequence[float]) -> float:
    """The most that running a part's operators side by side could save: their summed cost less
    its costliest chain (the critical path, which runs in order whatever the schedule). Operators
    are in topological order; succ[i] is the bitmask of i's successors; costs[i] its cost alone."""
    longest = list(costs)  # the costliest chain ending at each operator
    for i, mask in enumerate(succ):
        for j in _ops_of(mask):
            longest[j] = max(longest[j], longest[i] + costs[j])
    return sum(costs) - max(longest, default=0.0)


def _apportion(threads: int, weights: Sequence[float], order: Sequence[float] | None = None) -> tuple[int, ...]:
    """`threads` in proportion to `weights`, one each at least, the rest by largest remainder (ties:
    the larger `order` first, then the earlier group)."""
    count = len(weights)
    spare, total = threads - count, sum(weights) or 1.0
    exact = [spare * w / total for w in weights]
    split = [1 + int(x) for x in exact]
    order = order or weights
    for i in sorted(range(count), key=lambda i: (-(exact[i] - int(exact[i])), -order[i], i))[:threads - sum(split)]:
        split[i] += 1
    return tuple(split)


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


def _ops_of(mask: int) -> tuple[int, ...]:
    return tuple(op for op in range(mask.bit_length()) if (mask >> op) & 1)


class IOSSearch:
    """The DP for one part of a graph.

    succ[i] is the bitmask of operator i's successors; operators are numbered in a
    topological order (every edge goes from a lower to a higher index).
    """

    def __init__(self, succ: Sequence[int], threads: int, stage_cost: StageCost,
                 merge_cost: MergeCost | None = None, max_group_size: int = 3, max_num_groups: int = 8,
                 prune: bool = True, lower_bound: LowerBound | None = None, margin: float = 0.0,
                 confirm: bool = False):
        for op, mask in enumerate(succ):
            if mask & ((1 << (op + 1)) - 1):
                raise ValueError(f"operator {op} has an edge to an earlier operator: number them topologically")
        self.succ, self.threads = list(succ), threads
        self.stage_cost, self.merge_cost = stage_cost, merge_cost
        self.max_group_size, self.max_num_groups = max_group_size, max_num_groups
        self.max_ending = max_group_size * max_num_groups
        self.prune, self.lower_bound = prune, lower_bound
        self.margin = margin  # measured costs are noisy: stop a measurement only this far above its limit
        self.confirm = confirm  # measure chosen stages again (see solve)
        self.candidates = self.stopped = self.skipped = 0
        self._known: dict[Candidate, tuple[float, bool]] = {}  # candidate -> (cost, exact)
        self._candidates: dict[int, list[Candidate]] = {}
        # A state's endings, and an ending's ops one by one, do not change between the DP's passes
        # (confirm re-runs it once per stage it measures again): computed once each.
        self._endings: dict[int, list[int]] = {}
        self._sequential: dict[int, float] = {}

    # ---- endings ------------------------------------------------------------------------------

    def endings(self, state: int) -> list[int]:
        """Every non-empty successor-closed subset of `state` with at most max_ending ops,
        smallest first (so the search has a schedule of `state` to compare with early)."""
        if state not in self._endings:
            self._endings[state] = self._find_endings(state)
        return self._endings[state]

    def _find_endings(self, state: int) -> list[int]:
        ops = _ops_of(state)
        found: set[int] = set()
        ordered: list[int] = []
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
            ordered += sorted(grown)
            frontier = grown
            if not frontier:
                break
        return ordered

    # ---- stage candidates ---------------------------------------------------------------------

    def stage_candidates(self, ending: int) -> list[Candidate]:
        """Ways to run the ops of `ending` as one stage."""
        if ending not in self._candidates:
            ops = _ops_of(ending)
            components = _components(ops, self.succ)
            found: list[Candidate] = []
            redundant = self.prune and len(ops) > 1 and len(components) == 1  # see the module docstring
            groups = None if redundant else _pack(components, self.max_num_groups, self.max_group_size)
            if groups is not None:
                work = [sum(self.op_cost(op) for op in group) for group in groups] if len(groups) > 1 else None
                found += [("parallel", groups, split) for split in thread_splits(self.threads, len(groups), work)]
            if self.merge_cost is not None and len(ops) > 1:
                found.append(("merge", (ops,), (self.threads,)))
            self._candidates[ending] = found
        return self._candidates[ending]

    def cost_of(self, candidate: Candidate, limit: float = INF) -> float:
        """The candidate's cost; once it is known to be above `limit`, any figure above it."""
        known = self._known.get(candidate)
        if known is not None and (known[1] or known[0] > limit):
            return known[0]
        kind, groups, split = candidate
        if self.prune and self.lower_bound is not None:
            bound = self.lower_bound(kind, groups, split)
            if bound is not None and bound > limit:
                self.skipped += 1
                self._known[candidate] = (bound, False)
                return bound
        asked = limit * (1 + self.margin) if self.prune else INF
        if kind == "merge":
            cost = self.merge_cost(groups[0], split[0], asked)
        else:
            cost = self.stage_cost(groups, split, asked)
        if cost is None:  # not possible: nothing was measured
            self._known[candidate] = (INF, True)
            return INF
        exact = cost <= asked
        self.candidates += 1
        self.stopped += not exact
        self._known[candidate] = (cost, exact)
        return cost

    def op_cost(self, op: int) -> float:
        """One operator alone on every thread: what a group's work is weighed by (thread_splits)."""
        return self.cost_of(("parallel", ((op,),), (self.threads,)))

    def sequential(self, ending: int) -> float:
        """The ops of `ending` one by one, each on every thread (measured in full, never measured
        again: confirm leaves one operator on every thread alone)."""
        if ending not in self._sequential:
            self._sequential[ending] = sum(self.op_cost(op) for op in _ops_of(ending))
        return self._sequential[ending]

    def best_stage(self, ending: int, limit: float = INF) -> Stage | None:
        """The cheapest way to run the ops of `ending` as one stage; candidates that cannot
        come below `limit` may be left at an estimate above it."""
        if self.prune:  # running E's ops one by one is always possible instead
            limit = min(limit, self.sequential(ending))
        best, best_cost = None, INF
        known = self._known
        for candidate in self.stage_candidates(ending):
            bound = limit if best is None else min(limit, best_cost)
            hit = known.get(candidate)  # cost_of's answer when it needs no measurement, without the call
            cost = hit[0] if hit is not None and (hit[1] or hit[0] > bound) else self.cost_of(candidate, bound)
            if cost < INF and (best is None or cost < best_cost):
                best, best_cost = candidate, cost
        return None if best is None else Stage(*best, best_cost)

    # ---- the DP -------------------------------------------------------------------------------

    def solve(self, progress: Callable[[int], None] | None = None) -> SearchResult:
        """The DP; then, where `confirm` is set, every stage it chose (other than one operator on
        every thread) is measured again and the DP re-run until its choice stands on second
        measurements: the minimum over thousands of noisy timings is biased low, so a stage
        chosen for one lucky timing would otherwise make the schedule look faster than it runs."""
        full = (1 << len(self.succ)) - 1
        sequential = self.sequential(full)  # every op alone: the bound pruning compares with
        confirmed: set[Candidate] = set()
        while True:
            stages, total, states = self._solve_once(full, progress)
            doubtful = [c for c in map(_candidate, stages)
                        if c not in confirmed and not (len(c[1]) == 1 and len(c[1][0]) == 1 and c[0] == "parallel")]
            if not self.confirm or not doubtful:
                return SearchResult(stages, total, states, self.candidates, sequential, self.stopped, self.skipped,
                                    len(confirmed))
            for candidate in doubtful:
                del self._known[candidate]
                self.cost_of(candidate)
                confirmed.add(candidate)
            progress = None  # the states were counted on the first pass

    def _solve_once(self, full: int, progress) -> tuple[list[Stage], float, int]:
        memo: dict[int, tuple[float, Stage | None]] = {0: (0.0, None)}

        def cost(state: int) -> float:
            """Best cost of scheduling `state` (memoised with its last stage)."""
            if state in memo:
                return memo[state][0]
            if progress:
                progress(1)
            best: tuple[float, Stage | None] = (INF, None)
            for ending in self.endings(state):
                rest = cost(state & ~ending)
                if self.prune and rest >= best[0]:
                    continue  # no stage costs less than nothing
                stage = self.best_stage(ending, best[0] - rest if self.prune else INF)
                if stage is not None and rest + stage.cost < best[0]:
                    best = (rest + stage.cost, stage)
            memo[state] = best
            return best[0]

        total = cost(full)
        stages, state = [], full
        while state:
            stage = memo[state][1]
            stages.append(stage)
            state &= ~sum(1 << op for op in stage.ops)
        stages.reverse()
        return stages, total, len(memo) - 1


def _candidate(stage: Stage) -> Candidate:
    return stage.kind, stage.groups, stage.threads
