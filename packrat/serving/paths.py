"""The path around a served point: what a batch costs in a pool beyond the figure a point measures
in its own process (decode, model and encode, from the bodies' copy on: point.ServedBatch). That is
the queue's hand-off, the message to the instance and its wake-up, the answers' way back and their
hand-out; for a process instance a hop between processes, for a thread instance a hop between
threads. `packrat profile` measures it at its end (the profiler's `path_probe`: measure_paths), per
instance kind measured, through a real pool of one instance at the grid's smallest and largest
batch (LARGEST at most), and writes it in the profile's `path_ms` line; loading the profile adds
it to the served figures (profiles.path_at), so the planner weighs each kind's path and predicts
what a pool serves.

Cost: one pool per kind (one instance, forked), WARMUP + SUB_BATCHES batches at each of two batch
sizes (up to LARGEST) and BUDGET_S, whatever the cores and the grid: a few seconds a kind.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

from packrat.codec.config import CodecConfig
from packrat.machine.topology import Topology
from packrat.models.modes import served
from packrat.models.runtimes import instance_kind
from packrat.profiling.profiles import Paths, Profile
from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request
from packrat.serving.pool.instance_pool import InstancePool
from packrat.serving.settling import answered

IN_SERVED_FIGURE = ("copy", "decode", "model", "encode")  # the stages point.ServedBatch times
WARMUP = 3  # untimed batches at each size (an instance's first batches run slow)
SUB_BATCHES = 20  # timed batches at each size: their median path is the figure ...
BUDGET_S = 4.0  # ... or fewer, where the rounds have taken this long ...
MIN_SUB_BATCHES = 5  # ... but never fewer than this many
LARGEST = 8  # the largest batch timed: the path grows by a few µs a request, the model by ms
# the runtimes a kind's path is measured with, first measured first: those that load fast (the
# path is the transport's, not the model's)
PROBE_RUNTIMES = {"process": ("onnxruntime", "openvino"), "thread": ("onnxruntime-thread",)}


def probes(profile: Profile) -> dict[str, tuple[str, int]]:
    """Per instance kind the profile measured and one of PROBE_RUNTIMES serves: (runtime, threads),
    threads its most-threaded point's (the fastest run: the cheapest to time)."""
    found = {}
    for kind, runtimes in PROBE_RUNTIMES.items():
        runtime = next((r for r in runtimes if r in profile.by_runtime), None)
        if runtime is not None:
            found[kind] = runtime, max(t for t, _ in profile.by_runtime[runtime])
    return found


def unprobed(profile: Profile) -> list[str]:
    """The instance kinds the profile measured whose path probes() cannot measure (inductor or ios
    alone): planned without it."""
    return sorted({instance_kind(r) for r in profile.by_runtime} - set(probes(profile)))


def measure_paths(profile: Profile, model: str, input_shape, topology: Topology,
                  say: Callable[[str], None] = print) -> Paths:
    """Each probed kind's path in ms at the profile's smallest and largest batch (LARGEST at most),
    measured through a pool of one instance (`model` as the profile's points ran it) answering the
    profile's payload; the kinds it cannot probe (unprobed) are said."""
    from packrat.codec.payloads import payload_of  # torch: not at import (the CLI's parser starts without it)
    from packrat.models.zoo import resolve

    spec = resolve(model, input_shape)
    request = Request.as_received(*payload_of(spec, profile.payload or "raw"))
    smallest = min(profile.batches)
    sizes = sorted({smallest, max(smallest, min(max(profile.batches), LARGEST))})
    config = ModelConfig(model, input_shape, graph_mode=served(profile.metadata.get("mode")))
    for kind in unprobed(profile):
        say(f"the path around {kind} instances is not measured: none of {', '.join(PROBE_RUNTIMES[kind])} "
            f"was profiled; their figures leave it out")
    paths: Paths = {}
    for kind, (runtime, threads) in probes(profile).items():
        instance = InstanceConfig(threads, sizes[-1], tuple(topology.cores_for(threads)), runtime=runtime)
        with InstancePool(config, [instance], codec=CodecConfig.for_model(spec), gather_ms=0.0) as pool:
            fallbacks = pool.health().fallbacks
            if fallbacks:
                say(f"path of {kind} instances not measured: {'; '.join(fallbacks)}")
                continue
            paths[kind] = timed_paths(pool, request, sizes)
        say(f"path around {kind} instances ({runtime}, {threads} threads): "
            + ", ".join(f"{ms:.3f} ms at B={size}" for size, ms in paths[kind].items()))
    return paths


def timed_paths(pool, request, sizes, warmup: int = WARMUP, sub_batches: int = SUB_BATCHES,
                clock: Callable[[], float] = time.perf_counter, budget_s: float = BUDGET_S) -> dict[int, float]:
    """Per batch size of `sizes`, the median over `sub_batches` batches of `request` (fewer where
    they take more than `budget_s`, MIN_SUB_BATCHES at least) of each one's time through `pool` less
    what its instance spent in the served figure's stages (IN_SERVED_FIGURE). The sizes take turns,
    batch by batch, so that the machine's drift hits them alike."""
    for size in sizes:
        for _ in range(warmup):
            answered(pool, [request] * size)
    walls, began_s = [], clock()
    for number in range(sub_batches):
        if number >= MIN_SUB_BATCHES and clock() - began_s > budget_s:
            break
        for size in sizes:
            began = clock()
            answered(pool, [request] * size)
            walls.append((size, (clock() - began) * 1e3))
    inside = pool.stage_sums(IN_SERVED_FIGURE)[-len(walls):]
    return {size: max(0.0, statistics.median(wall - ms for (batch, wall), ms in zip(walls, inside) if batch == size))
            for size in sizes}
