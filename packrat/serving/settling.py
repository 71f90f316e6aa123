"""Near-ties settled before serving: the plans a profile cannot tell apart at a batch
(planning/settling.py picks them) timed side by side through pools of their own, in interleaved
rounds, and the winner served. The engine does it before it serves (engine.py), `packrat plan
--settle` offline, `packrat bench peers` for the plan it measures.

A round times every candidate still in the running once: one untimed batch first (another pool just
had the cores; its threads may still spin), then ITERS timed ones, their median the round's figure.
Rounds go on until the verdict is in (no challenger can still win), MAX_ROUNDS, or the time given
ends. Pools are started once per set of instances and reconfigured from batch to batch (their
instances kept: only each one's share changes), so settling several batches starts each instance
once; all are closed at the end. A candidate whose pool fails to start, or runs another runtime than
planned (a fallback), is left out, and the settlement says so.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from packrat.errors import PoolError
from packrat.planning.planner import Plan
from packrat.planning.settling import Candidate, Verdict, candidates, held, round_order, verdict
from packrat.serving.pool.api import Request, configs_for
from packrat.serving.tuner import plan_keys

log = logging.getLogger(__name__)

ITERS = 3  # timed batches per candidate and round
WARMUP = 2  # untimed batches of a pool before its first round (its first batches run slow)
MAX_ROUNDS = 10  # at most; a clear winner or loser ends them sooner


@dataclass
class Settlement:
    """What settling one batch found: the plan to serve and why."""
    batch: int
    cores: tuple[int, ...]
    profile_plan: str  # the profile's own plan (candidate 0)
    plan: Plan  # the winner: the plan served at this batch
    why: str  # the winner's candidate kind ("the profile's plan", "onnxruntime's best", ...)
    candidates: list[dict] = field(default_factory=list)  # label, why, expected_ms, median_ms, against the winner
    rounds: int = 0
    seconds: float = 0.0
    decided: bool = True  # False: rounds ran out with a challenger still able to win (the profile's plan stands)
    left_out: list[str] = field(default_factory=list)  # candidates that could not be timed, and why
    at: float = 0.0  # unix time it was settled

    @property
    def changed(self) -> bool:
        return self.plan.describe() != self.profile_plan

    def line(self) -> str:
        """E.g. 'settled B=4 on 1×⟨2 threads, batch 4, onnxruntime⟩ (onnxruntime's best): 102.1 ms against
        1×⟨2 threads, batch 4, openvino⟩ (the profile's plan) 105.3 ms, 0 of 5 rounds faster (5 rounds, 4.2 s)'."""
        won = next(c for c in self.candidates if c["label"] == self.plan.describe())
        others = [c for c in self.candidates if c is not won and c.get("median_ms") is not None]
        against = "; ".join(f"{c['label']} ({c['why']}) {ms_text(c)}, {verb(c)}" for c in others)
        tail = f"{self.rounds} rounds, {self.seconds:.1f} s" + ("" if self.decided else ", rounds ran out")
        left = f"; left out: {'; '.join(self.left_out)}" if self.left_out else ""
        return (f"settled B={self.batch} on {won['label']} ({won['why']}): {ms_text(won)} against "
                f"{against or 'nothing'} ({tail}){left}")

    def to_json(self) -> dict:
        found = asdict(self)
        found["plan"] = self.plan.to_json()
        found["plan_text"], found["line"], found["changed"] = self.plan.describe(), self.line(), self.changed
        return found


def ms_text(row: dict) -> str:
    return "not timed" if row.get("median_ms") is None else f"{row['median_ms']:.1f} ms"


def verb(other: dict) -> str:
    """How a candidate fared against the winner, in words."""
    if other.get("of") is None:
        return "not paired"
    lead = f"{other['faster_in']} of {other['of']} rounds faster"
    return lead + (" (level: no winner on a coin toss)" if other.get("level") else "")


def batches_to_settle(start: int, max_batch: int, follows_load: bool) -> list[int]:
    """The batches an engine may serve, nearest the first one first: the estimator's targets (powers
    of two up to `max_batch`, and `max_batch`) when it follows the load, else `start` alone."""
    if not follows_load:
        return [start]
    sizes = {1 << k for k in range(max_batch.bit_length()) if 1 << k <= max_batch} | {max_batch, start}
    return sorted(sizes, key=lambda b: (abs(math.log2(b / start)), b))


def instances_of(configs) -> tuple:
    """A pool's instances as the pool keeps them across a reconfiguration (supervisor.match)."""
    return tuple(sorted((c.threads, tuple(c.cores), c.runtime) for c in configs))


class Pools:
    """The pools settling starts, kept across batches: `start(configs)` builds one (an InstancePool,
    say); a plan of the same instances (threads, cores, runtime) at another batch reconfigures one
    of them, starting nothing. Two plans of one batch never share a pool (⟨1, 1⟩ + ⟨1, 3⟩ and
    2 × ⟨1, 2⟩ have the same instances, with other shares). close() ends them all."""

    def __init__(self, start: Callable[[list], object], capacity: int):
        self.start, self.capacity = start, capacity
        self.pools: dict[tuple, list] = {}  # instances -> the pools of them

    def pool_for(self, plan: Plan, busy=()):
        """A pool of `plan`'s instances at its shares, none of `busy` (those of the other plans timed)."""
        configs = configs_for(plan, self.capacity)
        same = self.pools.setdefault(instances_of(configs), [])
        pool = next((p for p in same if all(p is not b for b in busy)), None)
        if pool is None:
            same.append(pool := self.start(configs))
        else:
            pool.reconfigure(configs)
        return pool

    def take(self, plan: Plan, capacity: int, fallbacks=None):
        """A started pool of `plan`'s instances, reconfigured to it (`capacity`, `fallbacks`:
        api.configs_for), handed over: close() leaves it; None where none was started."""
        configs = configs_for(plan, capacity, fallbacks)
        same = self.pools.get(instances_of(configs))
        if not same:
            return None
        pool = same.pop()
        pool.reconfigure(configs)
        return pool

    def close(self) -> None:
        for same in self.pools.values():
            for pool in same:
                pool.close()
        self.pools.clear()


def model_pools(model: str, profiled_mode: str | None, capacity: int) -> Pools:
    """Pools of the zoo `model` (or file) as a server runs it: in the graph mode its profile was
    measured in, answering whole batches (TorchServe's worker hands them over so)."""
    from packrat.codec.config import CodecConfig
    from packrat.models.modes import served
    from packrat.models.zoo import resolve
    from packrat.serving.pool.api import ModelConfig
    from packrat.serving.pool.instance_pool import InstancePool

    config, codec = ModelConfig(model, graph_mode=served(profiled_mode)), CodecConfig.for_model(resolve(model))
    return Pools(lambda configs: InstancePool(config, configs, codec=codec, gather_ms=0.0), capacity)


def settle_batches(profile, spec, pools: Pools, topology, batches: Sequence[int], time_s: float,
                   fat_only: bool = False, say: Callable[[str], None] = log.info) -> list[Settlement]:
    """Settle the near-ties of `profile` (a profiling Profile, on the figures it plans on) at each of
    `batches` on `topology`'s cores, in `pools`, within `time_s` seconds in all, shared among the
    batches that have near-ties, the first ones first; requests of the payload its figures time
    (raw tensors of the model `spec` where they time the model alone). `say` gets each line."""
    from packrat.codec.payloads import payload_of  # torch: not at import (the CLI's parser starts without it)

    points = {key: (ms, profile.spread_ms(*key)) for key, ms in profile.points().items()}
    tied = {batch: found for batch in batches
            if len(found := candidates(points, profile.runtimes, topology.num_cores, batch, topology, fat_only)) > 1}
    if not tied:
        return []
    say(f"settling near-ties at B={','.join(map(str, tied))}, {time_s:g} s at most")
    request = Request.as_received(*payload_of(spec, profile.payload if profile.basis == "served" else "raw"))
    deadline, settled = time.monotonic() + time_s, []
    for index, (batch, found) in enumerate(tied.items()):
        share = (deadline - time.monotonic()) / (len(tied) - index)
        if share <= 0:
            say(f"no time left to settle B={','.join(map(str, list(tied)[index:]))}: the profile's plans serve there")
            break
        try:
            settled.append(settle(found, pools, [request] * batch, share, topology.cores))
        except Exception as exc:  # the profile's plan serves; its pool says what failed when it starts
            say(f"B={batch} not settled: {type(exc).__name__}: {exc}")
            continue
        say(settled[-1].line())
    return settled


def settle(candidates: Sequence[Candidate], pools: Pools, requests: Sequence[Request], time_s: float,
           cores: Sequence[int], clock: Callable[[], float] = time.perf_counter, iters: int = ITERS,
           max_rounds: int = MAX_ROUNDS, wall: Callable[[], float] = time.time) -> Settlement:
    """Time `candidates` (the profile's plan first) at their batch in interleaved rounds through
    `pools`, with `requests` (one batch), within about `time_s` seconds, on `cores` (those the
    plans were made for); the settlement. `clock`: seconds, what the batches are timed with too."""
    began, first = clock(), candidates[0]
    deadline = began + time_s
    ready, left_out = {}, []
    for c in candidates:
        if c is not first and clock() >= deadline:  # a start may build (an AOT package: tens of seconds)
            left_out.append(f"{c.label}: no time left to start it")
            continue
        try:
            ready[c.label] = started(pools.pool_for(c.plan, list(ready.values())), c.plan, requests)
        except Exception as exc:  # timed without it: it cannot be served as planned anyway
            left_out.append(f"{c.label}: {type(exc).__name__}: {exc}")
    labels = [c.label for c in candidates if c.label in ready]
    rounds: list[dict[str, float]] = []
    found = verdict(rounds, labels, max_rounds) if labels else None
    while found is not None and not found.done and clock() < deadline:
        timed = [found.winner, *found.open]
        rounds.append({label: one_round(ready[label], requests, iters, clock)
                       for label in round_order([x for x in labels if x in timed], len(rounds))})
        found = verdict(rounds, labels, max_rounds)
    winner = next(c for c in candidates if c.label == found.winner) if found else first
    decided = found is None or found.done
    return Settlement(first.plan.batch, tuple(cores), first.label, winner.plan, winner.why,
                      described(candidates, found), len(rounds), clock() - began, decided, left_out, wall())


def started(pool, plan: Plan, requests: Sequence[Request]):
    """`pool`, warmed up at the plan's batch; PoolError where it runs another runtime than planned."""
    fallbacks = pool.health().fallbacks
    if fallbacks:
        raise PoolError(f"runs another runtime than planned ({'; '.join(fallbacks)})")
    for _ in range(WARMUP):
        answered(pool, requests)
    return pool


def one_round(pool, requests: Sequence[Request], iters: int, clock: Callable[[], float]) -> float:
    """One untimed batch, then the median ms of `iters` timed ones."""
    answered(pool, requests)
    times = []
    for _ in range(iters):
        began = clock()
        answered(pool, requests)
        times.append((clock() - began) * 1e3)
    return statistics.median(times)


def answered(pool, requests: Sequence[Request]) -> list:
    """The pool's answers to `requests`, run as one batch; PoolError where it refused any."""
    answers = pool.infer(list(requests))
    bad = [a for a in answers if not a.ok]
    if bad:
        raise PoolError(f"{len(bad)} of {len(answers)} requests answered {bad[0].status}: {bad[0].reason}")
    return answers


def described(candidates: Sequence[Candidate], found: Verdict | None) -> list[dict]:
    """Each candidate with its median over the rounds and how it fared against the winner."""
    rows = []
    for c in candidates:
        row = {"label": c.label, "why": c.why, "expected_ms": c.expected_ms, "spread_ms": c.spread_ms,
               "median_ms": (found.medians_ms.get(c.label) if found else None)}
        against = found.others.get(c.label) if found else None
        if against:
            row.update(ratio=against["ratio"], faster_in=against["faster_in"], of=against["of"],
                       level=against["ratio"] < 1)
        rows.append(row)
    return rows


class SettledPlans:
    """The settlements an engine made, by batch and cores: the plan it serves at a batch while the
    profile's own plan there is still the one settled against, no served figure of that plan came
    since (a trial served it: what was served decides from then on), and the profile still holds
    the winner's runtimes (say, thread kinds left out for decoded bodies)."""

    def __init__(self):
        self.by_batch: dict[tuple[int, tuple[int, ...]], Settlement] = {}

    def add(self, settlement: Settlement) -> None:
        self.by_batch[settlement.batch, settlement.cores] = settlement

    def get(self, batch: int, cores: Sequence[int]) -> Settlement | None:
        return self.by_batch.get((batch, tuple(cores)))

    def plan(self, plan: Plan, cores: Sequence[int], points, corrections) -> Plan:
        """The plan to serve instead of the profile's `plan` on `cores`: the settled winner where it
        stands. `points`: the profile's (threads, batch, runtime) keys; `corrections`: key -> when
        each served figure was made (unix time)."""
        found = self.get(plan.batch, cores)
        if found is None or not found.changed or found.profile_plan != plan.describe():
            return plan
        served_since = any(corrections.get(key, 0.0) > found.at for key in plan_keys(plan))
        if served_since or not all(held(points, key) for key in plan_keys(found.plan)):
            return plan
        return found.plan

    def status(self) -> list[dict]:
        return [s.to_json() for _, s in sorted(self.by_batch.items())]
