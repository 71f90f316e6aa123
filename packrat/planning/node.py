"""The node planner: one plan of cores for every model served on a machine. Pure: plain numbers in,
plain numbers out.

Each model brings its profile (L(t, b) items), the batch B its plan is for, its observed load and,
optionally, a latency objective (SLO). The load is requests per second, 0 for an idle model, or
None for a *saturated* one: a closed loop (or a queue) that takes whatever throughput it gets.

The planner splits the node's T cores into *blocks*, disjoint core sets, and gives each busy model
one block: a block of one model is its own (a disjoint partition); a block of several is
time-shared, the models taking turns of equal time under per-core locks, so two models'
threads never run on one core at once. Inside its block a model runs its own ⟨i, t, b⟩ plan
(planning/planner.py). Taking turns can beat a split: where one thread is far slower than two
(ResNet-50 on a 2-core VM: L(1, 4) = 384 ms, L(2, 4) = 198 ms), two light loads do better with both
cores each, in turn, than with one core each.

Latency of model m in a block of c cores, with s_j = the planner's optimal latency for B_j on c
cores and r_j = λ_j / B_j batches a second (u_j = r_j·s_j, the share of the block's time it needs):
  - no saturated member, Σu < 1: s_m + Σ_j r_j·s_j² / (2(1 - Σu))   (batches queue FIFO, M/D/1)
  - saturated members S (or Σ_{j∉S} u_j ≥ 1, when every member counts as saturated): the saturated
    models take turns (pool/turns.py) of up to the block's quantum q = max(`turn_ms`, the longest
    request of any member, max_j s_j / B_j): a request cannot be cut, so a quantum shorter than
    another member's request would give that member the longer turns (measured, issue 33:
    ResNet-50 in 100 ms turns against BERT's 280 ms requests on one core got 0.15 of its
    throughput alone). A batch longer than q is cut into turns of t_j = q; a shorter one
    is a turn of its own, t_j = s_j: a model's next batch reaches its pool only once the server
    has had this one's answers (TorchServe hands a worker one batch at a time; a closed loop sends
    again only when answered), which comes later than a turn waits for it, so a light model runs
    one batch a turn, not q of them (measured, issue 33: in turns with ResNet-50 and BERT,
    SqueezeNet waited 100–300 ms for a turn before each of its 60 ms batches). A cycle of turns lasts
    C = Σ_{j∈S} t_j / (1 - Σ_{j∉S} u_j), stretched by the light members' share, and model i runs
    t_i of its s_i in each: its latency is s_i·C/t_i (× TURN_COST where several take turns); a
    light one waits for the turn running, s_m + mean_{j∈S} t_j.
A model's *alone* latency is the same formula with it alone on all T cores; its slowdown is the
ratio (for a saturated model, the inverse of its throughput against alone).

Objective: minimise the worst model's score, the slowdown (or, for a model with an SLO, its latency
over the SLO: every SLO is met when that score is at most 1, and the plan with the most headroom
serves the most load within them); ties go to the smaller sum of scores, then to fewer time-shared
blocks. For every grouping of the busy models into blocks, the smallest worst score that fits is a
binary search (each block's score only falls as it gets cores); spare cores then go one by one
where they lower the sum most. An idle model keeps one warm 1-thread instance: on a spare core if
there is one, else taking turns on the last core of the largest block.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from packrat.errors import NoPlanError
from packrat.machine.topology import Topology
from packrat.planning.planner import Item, Plan, Planner
from packrat.settings import TURN_MS  # the quantum q of a turn on time-shared cores

INF = math.inf
TURN_COST = 1.05  # a margin for what turns cost that a split does not: hand-offs, the next model's cold caches
MAX_GROUPED = 8  # busy models beyond this are not tried in every grouping (Bell(8) = 4,140 already)


@dataclass(frozen=True)
class ModelLoad:
    """One model as the node planner sees it."""

    name: str
    items: tuple[Item, ...]  # its profile: (threads, batch, latency_ms)
    batch: int  # B, the batch its plan is for
    rate: float | None = None  # requests a second; 0: idle; None: saturated (takes what it gets)
    slo_ms: float | None = None  # its latency objective, if it has one

    @property
    def idle(self) -> bool:
        return self.rate is not None and self.rate <= 0

    def batches_per_s(self) -> float | None:
        return None if self.rate is None else self.rate / self.batch


@dataclass(frozen=True)
class Share:
    """One model's place on the node: its cores, the models it takes turns with, its plan there."""

    model: str
    cores: tuple[int, ...]
    shared_with: tuple[str, ...]  # models whose instances run on some of these cores, in turns
    plan: Plan
    latency_ms: float  # expected, with the waiting for turns
    alone_ms: float  # expected with every core to itself, at its load
    score: float  # what the objective weighs: slowdown, or latency over the SLO
    slo_ms: float | None = None
    idle: bool = False
    longest_request_ms: float | None = None  # where it takes turns: the longest request on its block

    @property
    def locked(self) -> bool:
        """Its instances take the per-core locks: some of its cores are time-shared."""
        return bool(self.shared_with)

    @property
    def slowdown(self) -> float:
        return self.latency_ms / self.alone_ms if self.alone_ms else INF

    def to_json(self) -> dict:
        return {"cores": list(self.cores), "shared_with": list(self.shared_with), "idle": self.idle, "slo_ms": self.slo_ms,
                "plan": self.plan.to_json(), "plan_text": self.plan.describe(),
                "expected_latency_ms": _finite(self.latency_ms), "alone_latency_ms": _finite(self.alone_ms),
                "slowdown": _finite(self.slowdown), "score": _finite(self.score),
                "longest_request_ms": _finite(self.longest_request_ms) if self.longest_request_ms else None}


@dataclass(frozen=True)
class NodePlan:
    cores: int  # T
    shares: tuple[Share, ...]
    objective: str  # what was minimised, in words

    @property
    def worst(self) -> float:
        return max((s.score for s in self.shares if not s.idle), default=0.0)

    @property
    def missed_slo(self) -> tuple[str, ...]:
        """Models whose SLO the plan cannot meet at their load."""
        return tuple(s.model for s in self.shares if not s.idle and s.slo_ms and s.score > 1)

    def share(self, model: str) -> Share:
        return next(s for s in self.shares if s.model == model)

    def allocation(self) -> dict[str, tuple[tuple[int, ...], bool]]:
        """Model -> (its cores, whether they are time-shared): what a change of plan moves."""
        return {s.model: (s.cores, s.locked) for s in self.shares}

    def describe(self) -> str:
        return "; ".join(f"{s.model}: cores {_span(s.cores)}{' (turns with ' + ', '.join(s.shared_with) + ')' if s.shared_with else ''}"
                         f" {s.plan.describe()}" for s in self.shares)

    def to_json(self) -> dict:
        return {"cores": self.cores, "objective": self.objective, "worst_score": _finite(self.worst),
                "missed_slo": list(self.missed_slo), "models": {s.model: s.to_json() for s in self.shares}}


# ---- the cost of a block -------------------------------------------------------------------------

def service_ms(load: ModelLoad, max_cores: int) -> np.ndarray:
    """s[c]: the optimal latency of the model's batch on c cores, c = 0..max_cores (inf where the
    profile cannot cover it)."""
    planner = Planner(list(load.items), max_cores, load.batch)
    return planner.table[:, load.batch].copy()


def longest_request_ms(loads: Sequence[ModelLoad], service: Sequence[float]) -> float:
    """The longest single request of the models on a block (a turn cannot be shorter)."""
    return max(s / load.batch for load, s in zip(loads, service))


def block_quantum(loads: Sequence[ModelLoad], service: Sequence[float], turn_ms: float) -> float:
    """The longest turn a model takes on a block: `turn_ms`, or any member's request if longer."""
    return max(turn_ms, longest_request_ms(loads, service))


def turn_length(service: float, batch: int, quantum: float) -> float:
    """A saturated model's turn (ms) on a time-shared block where its batch takes `service`: the
    batch, when it fits the quantum; else the quantum (cut at a request: about that long)."""
    return service if service <= quantum else max(quantum, service / batch)


def block_latencies(loads: Sequence[ModelLoad], service: Sequence[float], turn_ms: float = TURN_MS) -> list[float]:
    """Expected latency (ms) of each model taking turns on one block, given each one's service time
    there (see the module's docstring)."""
    if any(not math.isfinite(s) for s in service):
        return [INF] * len(loads)
    rates = [load.batches_per_s() for load in loads]
    shares = [r * s / 1e3 if r is not None else None for r, s in zip(rates, service)]
    if None not in shares and sum(shares) < 1:
        wait = sum(r * s * s / 1e3 for r, s in zip(rates, service)) / (2 * (1 - sum(shares)))
        return [s + wait for s in service]
    saturated = [i for i, u in enumerate(shares) if u is None]
    light = sum(u for u in shares if u is not None)
    if not saturated or light >= 1:  # over capacity: every member takes what it gets
        saturated, shares, light = list(range(len(loads))), [None] * len(loads), 0.0
    quantum = block_quantum(loads, service, turn_ms)
    turns = {i: turn_length(service[i], loads[i].batch, quantum) for i in saturated}
    cycle = sum(turns.values()) / (1 - light) * (TURN_COST if len(saturated) > 1 else 1.0)
    running = sum(turns.values()) / len(saturated)
    return [service[i] * cycle / turns[i] if shares[i] is None else service[i] + running for i in range(len(loads))]


def score(load: ModelLoad, latency: float, alone: float) -> float:
    """What the objective weighs for one model: latency over its SLO, else its slowdown."""
    if load.slo_ms:
        return latency / load.slo_ms
    return latency / alone if alone > 0 else INF


# ---- the search ----------------------------------------------------------------------------------

def groupings(items: Sequence[int], most_blocks: int) -> Iterator[list[list[int]]]:
    """Every partition of `items` into at most `most_blocks` non-empty blocks."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in groupings(rest, most_blocks):
        for i in range(len(partition)):
            yield partition[:i] + [[first] + partition[i]] + partition[i + 1:]
        if len(partition) < most_blocks:
            yield [[first]] + partition


@dataclass
class _Block:
    members: list[int]
    scores: np.ndarray  # scores[c, k]: member k's score on c cores
    cores: int = 0

    def worst(self, c: int) -> float:
        return float(self.scores[c].max())

    def total(self, c: int) -> float:
        return float(self.scores[c].sum())

    def fewest_cores(self, bound: float) -> int | None:
        """The fewest cores on which every member scores at most `bound`."""
        ok = np.nonzero(self.scores[1:].max(axis=1) <= bound)[0]
        return int(ok[0]) + 1 if len(ok) else None


class NodePlanner:
    def __init__(self, loads: Sequence[ModelLoad], cores: int):
        if cores < 1:
            raise ValueError("a node needs at least one core")
        names = [load.name for load in loads]
        if len(set(names)) != len(names):
            raise ValueError(f"model names repeat: {names}")
        self.loads, self.cores = list(loads), cores
        self.service = [service_ms(load, cores) for load in self.loads]
        for load, service in zip(self.loads, self.service):
            if not math.isfinite(service[cores]):
                raise NoPlanError(f"{load.name}: its profile cannot cover batch {load.batch} on {cores} cores")
        self.alone = [block_latencies([load], [service[cores]])[0] for load, service in zip(self.loads, self.service)]
        self._scores: dict[tuple[int, ...], np.ndarray] = {}

    def block(self, members: list[int]) -> _Block:
        key = tuple(members)
        if key not in self._scores:
            self._scores[key] = self._block_scores(members)
        return _Block(members, self._scores[key])

    def _block_scores(self, members: list[int]) -> np.ndarray:
        scores = np.full((self.cores + 1, len(members)), INF)
        for c in range(1, self.cores + 1):
            latencies = block_latencies([self.loads[m] for m in members], [self.service[m][c] for m in members])
            scores[c] = [score(self.loads[m], lat, self.alone[m]) for m, lat in zip(members, latencies)]
        return scores

    def busy(self) -> list[int]:
        busy = [i for i, load in enumerate(self.loads) if not load.idle]
        return busy or list(range(len(self.loads)))  # nothing observed anywhere: plan them all as busy

    def candidates(self, busy: list[int]) -> Iterator[list[list[int]]]:
        if len(busy) <= MAX_GROUPED:
            yield from groupings(busy, self.cores)
            return
        if len(busy) <= self.cores:
            yield [[m] for m in busy]
        yield [busy]

    def best_split(self, blocks: list[_Block]) -> tuple[float, float] | None:
        """Cores for each block (set on them) minimising the worst score, then the sum; None if the
        blocks cannot all fit."""
        if len(blocks) > self.cores:
            return None
        bounds = sorted({v for b in blocks for v in b.scores[1:].max(axis=1) if math.isfinite(v)})
        fits = lambda bound: _fewest(blocks, bound, self.cores)  # noqa: E731
        low, high = 0, len(bounds) - 1
        if not bounds or fits(bounds[high]) is None:
            return None
        while low < high:  # the smallest bound whose fewest cores fit on the node
            middle = (low + high) // 2
            low, high = (low, middle) if fits(bounds[middle]) is not None else (middle + 1, high)
        for block, cores in zip(blocks, fits(bounds[low])):
            block.cores = cores
        _spend_spare(blocks, self.cores - sum(b.cores for b in blocks))
        return max(b.worst(b.cores) for b in blocks), sum(b.total(b.cores) for b in blocks)

    def plan(self, topology: Topology | None = None) -> NodePlan:
        topology = topology or Topology.virtual(self.cores)
        if topology.num_cores != self.cores:
            raise ValueError(f"the topology has {topology.num_cores} cores, the plan is for {self.cores}")
        busy = self.busy()
        best, best_key = None, None
        for grouping in self.candidates(busy):
            blocks = [self.block(members) for members in grouping]
            result = self.best_split(blocks)
            if result is None:
                continue
            key = (_rounded(result[0]), _rounded(result[1]), sum(len(b.members) > 1 for b in blocks))
            if best_key is None or key < best_key:
                best, best_key = [(b.members, b.cores) for b in blocks], key
        if best is None:
            raise NoPlanError(f"{len(busy)} models cannot be placed on {self.cores} cores")
        return self._node_plan(best, topology, busy)

    def evaluate(self, allocation: dict) -> float:
        """The worst score of the busy models if they kept the cores `allocation` gives them
        (model -> (cores, ...)) at today's loads: models whose cores overlap, directly or through
        another, count as taking turns on all of their cores together."""
        blocks: list[tuple[set[int], list[int]]] = []
        for m in self.busy():
            given = allocation.get(self.loads[m].name)
            if given is None or not given[0]:
                return INF
            cores, members = set(given[0]), [m]
            for block in [b for b in blocks if b[0] & cores]:
                blocks.remove(block)
                cores, members = cores | block[0], members + block[1]
            blocks.append((cores, members))
        worst = 0.0
        for cores, members in blocks:
            count = min(len(cores), self.cores)
            latencies = block_latencies([self.loads[m] for m in members], [self.service[m][count] for m in members])
            worst = max(worst, *(score(self.loads[m], lat, self.alone[m]) for m, lat in zip(members, latencies)))
        return worst

    def _node_plan(self, blocks: list[tuple[list[int], int]], topology: Topology, busy: list[int]) -> NodePlan:
        placed = dict(enumerate(map(tuple, topology.assign([count for _, count in blocks]))))
        spare = sorted(set(topology.cores) - {c for cores in placed.values() for c in cores})
        shared_with: dict[int, set[int]] = {m: {o for o in members if o != m}
                                            for members, _ in blocks for m in members}
        users = {c: set(members) for i, (members, _) in enumerate(blocks) for c in placed[i]}  # core -> models
        idle_cores: dict[int, tuple[int, ...]] = {}
        largest = placed[max(range(len(blocks)), key=lambda i: blocks[i][1])]
        for m in (i for i in range(len(self.loads)) if i not in busy):
            core = spare.pop() if spare else largest[-1]
            idle_cores[m], neighbours = (core,), users.setdefault(core, set())
            shared_with[m] = set(neighbours)
            for j in neighbours:
                shared_with[j].add(m)
            neighbours.add(m)
        shares = []
        for index, (members, count) in enumerate(blocks):
            cores = placed[index]
            sub = topology_of(topology, cores)
            loads, service = [self.loads[m] for m in members], [self.service[m][count] for m in members]
            latencies = block_latencies(loads, service)
            longest = longest_request_ms(loads, service) if len(members) > 1 else None
            for m, latency in zip(members, latencies):
                load = self.loads[m]
                plan = Planner(list(load.items), count, load.batch).plan(count, load.batch, sub)
                shares.append(Share(load.name, cores, self._names(shared_with[m]), plan, latency, self.alone[m],
                                    score(load, latency, self.alone[m]), load.slo_ms, longest_request_ms=longest))
        for m, cores in idle_cores.items():
            shares.append(self._warm(m, cores, topology, shared_with[m]))
        shares.sort(key=lambda s: [load.name for load in self.loads].index(s.model))
        return NodePlan(self.cores, tuple(shares), self.objective())

    def _warm(self, m: int, cores: tuple[int, ...], topology: Topology, shared_with: set[int]) -> Share:
        """An idle model's warm instance: its batch on one thread (the fat plan there when the
        profile cannot cover the batch on one thread)."""
        load = self.loads[m]
        planner = Planner(list(load.items), 1, load.batch)
        sub = topology_of(topology, cores)
        try:
            plan = planner.plan(1, load.batch, sub)
        except NoPlanError:
            plan = planner.fat(1, load.batch, sub)
        latency = plan.expected_latency_ms if plan.expected_latency_ms is not None else INF
        return Share(load.name, cores, self._names(shared_with), plan, latency, self.alone[m], 0.0, load.slo_ms,
                     idle=True)

    def _names(self, indices: set[int]) -> tuple[str, ...]:
        return tuple(self.loads[i].name for i in sorted(indices))

    def objective(self) -> str:
        if any(load.slo_ms for load in self.loads):
            return "the worst latency over its SLO (slowdown against alone for models without one)"
        return "the worst slowdown against each model alone on the node at its load"


def _fewest(blocks: list[_Block], bound: float, cores: int) -> list[int] | None:
    needed = [b.fewest_cores(bound) for b in blocks]
    if None in needed or sum(needed) > cores:
        return None
    return needed


def _spend_spare(blocks: list[_Block], spare: int) -> None:
    """Give spare cores one by one to the block whose summed score falls most; keep the rest spare."""
    for _ in range(spare):
        gains = [(b.total(b.cores) - b.total(b.cores + 1), i) for i, b in enumerate(blocks)
                 if b.cores + 1 < len(b.scores)]
        gain, index = max(gains, default=(0.0, -1))
        if gain <= 1e-9:
            return
        blocks[index].cores += 1


def _rounded(value: float) -> float:
    """Scores equal to 1e-9 relative count as ties (float noise of sums must not pick a plan)."""
    return round(value, 9) if math.isfinite(value) else INF


def _span(cores: tuple[int, ...]) -> str:
    if cores and list(cores) == list(range(cores[0], cores[-1] + 1)) and len(cores) > 1:
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def topology_of(topology: Topology, cores: Sequence[int]) -> Topology:
    """The part of `topology` made of `cores`, sockets kept."""
    wanted = set(cores)
    return Topology(tuple(kept for socket in topology.sockets if (kept := tuple(c for c in socket if c in wanted))))


def plan_node(loads: Sequence[ModelLoad], cores: int, topology: Topology | None = None) -> NodePlan:
    """One-shot: the node plan for `loads` on `cores` cores (of `topology`, default 0..cores-1)."""
    return NodePlanner(loads, cores).plan(topology)


# ---- moving from one node plan to the next -------------------------------------------------------

Allocation = dict[str, tuple[tuple[int, ...], bool]]  # member -> (its cores, whether it takes turns on them)


def transition(old: Allocation, new: Allocation) -> list[Allocation]:
    """The steps from `old` to `new`, each applied by every member before the next begins, such that
    at every moment (a member may still run its previous step's instances beside the next's) two
    members' cores overlap only where both take turns under the core locks:
      1. turns: every member that moves, and every member whose cores a mover will reach, takes turns
         on the cores it has (no core changes hands, so nothing new overlaps);
      2. move: every mover goes to its new cores, still taking turns;
      3. settle: each member's own flag from `new` (a member leaves turns only where `new` lets it,
         and then no one else is on its cores).
    A member in `new` alone (joining) first appears at step 2; one in `old` alone (leaving) is gone
    from step 1. Steps that change nothing are left out."""
    staying = {m: old[m] for m in old if m in new}
    movers = {m for m in new if m not in staying or staying[m][0] != new[m][0]}
    reached = {c for m in movers for c in new[m][0]}
    turns = {m: (cores, locked or m in movers or bool(reached & set(cores))) for m, (cores, locked) in staying.items()}
    move = {m: (new[m][0], True) if m in movers else turns[m] for m in new}
    steps, last = [], staying
    for step in (turns, move, dict(new)):
        if step != last:
            steps.append(step)
            last = step
    return steps
