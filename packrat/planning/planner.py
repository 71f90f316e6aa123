"""The Packrat planner: a knapsack-style dynamic program over profiled points.

Given L(t, b) for profiled points ⟨t, b⟩, choose a multiset of instances with
Σt ≤ T and Σb = B minimising the slowest instance's latency, max L. Instances may
differ from each other. Pure: plain numbers in, plain numbers out.

Recurrence, over (threads available, batch to cover):
    opt[t][0] = 0                               (nothing left to cover; spare threads allowed)
    opt[t][b] = min over items (ti ≤ t, bi ≤ b) of max(L(ti, bi), opt[t - ti][b - bi])
Every item uses ≥ 1 thread, so row t only reads rows < t: rows are filled in
order, each one with numpy over all b at once.

Runtimes: a profile may hold each point under several runtimes (inductor, OpenVINO, ONNX Runtime);
its L(t, b) is the fastest of them, and `runtimes` says which, so each planned instance carries
the runtime it runs (one plan may mix them). The DP itself never sees runtimes.

Ties: among plans reaching the optimal latency L*, prefer fewer instances, then
fewer threads. That is a second, additive DP over the items with L ≤ L*
(cost = instances · (T + 1) + threads), which also yields the plan itself.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from packrat.errors import NoPlanError
from packrat.machine.topology import Topology

Item = tuple[int, int, float]  # (threads, batch, latency_ms)
DEFAULT_RUNTIME = "inductor"  # packrat.models.runtimes.DEFAULT_RUNTIME (planning imports no models)


@dataclass(frozen=True)
class Instance:
    threads: int
    batch: int
    latency_ms: float
    cores: tuple[int, ...] = ()
    runtime: str = DEFAULT_RUNTIME


@dataclass(frozen=True)
class Plan:
    threads: int  # T, the cores the plan may use
    batch: int  # B, the batch it covers
    instances: tuple[Instance, ...]
    expected_latency_ms: float | None  # None only for an unprofiled fat plan (Planner.fat)
    fat_latency_ms: float | None  # L(T, B): one instance using every core, if profiled

    @property
    def speedup(self) -> float | None:
        if self.fat_latency_ms and self.expected_latency_ms:
            return self.fat_latency_ms / self.expected_latency_ms
        return None

    @property
    def threads_used(self) -> int:
        return sum(i.threads for i in self.instances)

    def groups(self) -> list[tuple[int, int, int, str]]:
        """(count, threads, batch, runtime) for each distinct instance, biggest first."""
        counts: dict[tuple[int, int, str], int] = {}
        for inst in self.instances:
            key = (inst.threads, inst.batch, inst.runtime)
            counts[key] = counts.get(key, 0) + 1
        return [(n, t, b, r) for (t, b, r), n in sorted(counts.items(), reverse=True)]

    def describe(self) -> str:
        """E.g. '2×⟨4 threads, batch 4⟩ + 1×⟨6 threads, batch 8, openvino⟩' (the default runtime unnamed)."""
        return " + ".join(f"{n}×⟨{t} threads, batch {b}{'' if r == DEFAULT_RUNTIME else ', ' + r}⟩"
                          for n, t, b, r in self.groups())

    def to_json(self) -> dict:
        return {
            "threads": self.threads,
            "batch": self.batch,
            "expected_latency_ms": self.expected_latency_ms,
            "fat_latency_ms": self.fat_latency_ms,
            "instances": [{"threads": i.threads, "batch": i.batch, "cores": list(i.cores), "runtime": i.runtime}
                          for i in self.instances],
        }


@dataclass
class Planner:
    """Optimal max-latency table for every t ≤ max_threads and b ≤ max_batch."""

    items: list[Item]
    max_threads: int
    max_batch: int
    runtimes: Mapping[tuple[int, int], str] = field(default_factory=dict)  # (t, b) -> its runtime if not the default
    table: np.ndarray = field(init=False, repr=False)  # table[t, b] = optimal latency (inf: impossible)

    def __post_init__(self) -> None:
        if self.max_threads < 1 or self.max_batch < 1:
            raise ValueError("threads and batch must be >= 1")
        self.items = sorted((int(t), int(b), float(l)) for t, b, l in self.items
                            if t <= self.max_threads and b <= self.max_batch)
        self.table = self._latency_table()

    def _latency_table(self) -> np.ndarray:
        opt = np.full((self.max_threads + 1, self.max_batch + 1), np.inf)
        opt[:, 0] = 0.0
        width = self.max_batch + 1
        for t in range(1, self.max_threads + 1):
            row = opt[t]
            for ti, bi, latency in self.items:
                if ti > t:
                    break  # items are sorted by threads
                candidate = np.maximum(opt[t - ti, : width - bi], latency)
                np.minimum(row[bi:], candidate, out=row[bi:])
        return opt

    def plan(self, threads: int, batch: int, topology: Topology | None = None) -> Plan:
        """The optimal plan for T=threads, B=batch; cores from `topology`
        (default: cores 0..T-1 of one socket)."""
        if not (1 <= threads <= self.max_threads and 1 <= batch <= self.max_batch):
            raise ValueError(f"threads={threads}, batch={batch} outside the table "
                             f"(threads ≤ {self.max_threads}, batch ≤ {self.max_batch})")
        best = float(self.table[threads, batch])
        if not np.isfinite(best):
            raise NoPlanError(self._why_impossible(threads, batch))
        chosen = self._fewest_instances(threads, batch, best)
        chosen.sort(key=lambda item: (-item[0], -item[1]))
        topology = topology or Topology.virtual(threads)
        cores = topology.assign([t for t, _, _ in chosen])
        fat = {(t, b): l for t, b, l in self.items}.get((threads, batch))
        return Plan(
            threads=threads,
            batch=batch,
            instances=tuple(Instance(t, b, l, tuple(c), self.runtime(t, b)) for (t, b, l), c in zip(chosen, cores)),
            expected_latency_ms=max(l for _, _, l in chosen),
            fat_latency_ms=fat,
        )

    def fat(self, threads: int, batch: int, topology: Topology | None = None) -> Plan:
        """The baseline: one instance with every thread and the whole batch."""
        cores = (topology or Topology.virtual(threads)).assign([threads])[0]
        fat = {(t, b): l for t, b, l in self.items}.get((threads, batch))
        return Plan(threads, batch, (Instance(threads, batch, fat, tuple(cores), self.runtime(threads, batch)),), fat, fat)

    def runtime(self, threads: int, batch: int) -> str:
        """The runtime chosen at ⟨threads, batch⟩; at a point never measured, the one chosen nearest
        it (the same threads first): the default runtime there may first build a package for minutes
        (ResNet-50's fat ⟨1, 4⟩ in compile mode, on a node's one-core share, was still compiling when
        its load ended)."""
        if not self.runtimes or any(item[:2] == (threads, batch) for item in self.items):
            return self.runtimes.get((threads, batch), DEFAULT_RUNTIME)
        nearest = min(self.runtimes, key=lambda p: (abs(math.log(p[0] / threads)), abs(math.log(p[1] / batch)), p))
        return self.runtimes[nearest]

    def _fewest_instances(self, threads: int, batch: int, bound: float) -> list[Item]:
        """Among plans whose every instance has L ≤ bound: fewest instances, then fewest threads."""
        usable = [item for item in self.items if item[2] <= bound and item[0] <= threads and item[1] <= batch]
        cost = np.full((threads + 1, batch + 1), np.inf)
        cost[:, 0] = 0.0
        choice = np.full((threads + 1, batch + 1), -1, dtype=np.int64)
        width = batch + 1
        for t in range(1, threads + 1):
            for index, (ti, bi, _) in enumerate(usable):
                if ti > t:
                    break
                candidate = cost[t - ti, : width - bi] + (threads + 1 + ti)
                better = candidate < cost[t, bi:]
                cost[t, bi:][better] = candidate[better]
                choice[t, bi:][better] = index
        chosen, t, b = [], threads, batch
        while b > 0:
            item = usable[choice[t, b]]
            chosen.append(item)
            t, b = t - item[0], b - item[1]
        return chosen

    def _why_impossible(self, threads: int, batch: int) -> str:
        if not self.items:
            return f"no profiled point has threads ≤ {threads} and batch ≤ {batch}"
        batches = sorted({b for _, b, _ in self.items})
        min_threads = min(t for t, _, _ in self.items)
        return (f"batch {batch} cannot be split into profiled batch sizes {batches} "
                f"with at most {threads} threads (each instance needs ≥ {min_threads})")


def serving_plan(items: Iterable[Item], threads: int, batch: int, topology: Topology,
                 mode: str = "auto", runtimes: Mapping[tuple[int, int], str] | None = None) -> tuple[Plan, str | None]:
    """The plan a server runs: the optimal one (mode "auto") or the fat one (mode "fat").
    Falls back to fat when the profile cannot cover the batch; returns (plan, why it fell back)."""
    if mode not in ("auto", "fat"):
        raise ValueError(f"plan mode must be 'auto' or 'fat', got {mode!r}")
    planner = Planner(list(items), threads, batch, runtimes or {})
    if mode == "auto":
        try:
            return planner.plan(threads, batch, topology), None
        except NoPlanError as exc:
            return planner.fat(threads, batch, topology), f"no plan from the profile ({exc}); serving the fat instance"
    return planner.fat(threads, batch, topology), None


def plan(items: Iterable[Item], threads: int, batch: int, topology: Topology | None = None) -> Plan:
    """One-shot convenience: the optimal plan for T=threads, B=batch."""
    return Planner(list(items), threads, batch).plan(threads, batch, topology)
