"""Executes a schedule: stages one after another; within a stage, each group on a
persistent worker thread with its own intra-op thread count and its own cores.

Mechanism. A stage's groups run on Python threads; torch releases the GIL inside each
operator, so the groups' kernels run at the same time. Each worker is created for one
fixed core set: it pins itself with ``os.sched_setaffinity(0, cores)`` (on Linux this
pins the calling thread only) and calls ``torch.set_num_threads(len(cores))`` before
its first operator. With the OpenMP backend the thread count is a per-thread setting
(``omp_set_num_threads`` sets the calling thread's ICV), and the OpenMP team a worker
leads is created by that worker, after its pinning, so the team's threads inherit its
cores. Workers never change cores: a team created under one mask would keep it.

Measured here (torch 2.13, 2 cores; BENCHMARKS.md, issue 5): two 1-thread groups
on cores 0 and 1 ran three 64-channel 3x3 convolutions each in 25.3 ms, against 25.7 ms
for one such group alone (ratio 0.98): each group really had a core of its own. Each
worker thread reported its own single-core affinity and torch.get_num_threads() == its
share (tests/test_ios_runtime.py checks both). The same work with two unmanaged Python
threads at the default two intra-op threads each took 20.1 ms against 13.4 ms for running
them one after the other with two threads: oversubscription, which this mechanism avoids.
One more finding: that convolution took 25.7 ms on one thread but 6.7 ms on two, more than
2× faster, so a core share's effect is not linear. That is why every share is measured.

A second finding, about where the full-width stages run. libgomp counts the threads of
all OpenMP teams in the process; once that count exceeds the CPUs the process had when
libgomp loaded, every team's barrier stops spinning after about 100 iterations and sleeps
on a futex, so each parallel region pays a wake-up. A second 2-thread team beside the
main thread's on 2 cores was enough: plain Inception-v3 (batch 1, 2 threads) slowed from
66.8 ms to 100.2 ms (medians of three fresh processes), came back once that worker
thread exited, and 1-thread workers (no team) did not slow it. So a stage that runs one
group on every core runs on the calling thread with its own team, never on a worker, and
the caller must have torch.get_num_threads() == the schedule's threads (`caller_threads`).
With 2 cores this keeps the process at exactly 2 team threads. With more cores, each
distinct smaller core block still adds a team; when the blocks' threads outnumber the
cores, all teams sleep between regions, which the measured stage costs include.

A third: after a parallel region libgomp's idle team threads spin about 3 ms before they
sleep (GOMP_SPINCOUNT 300000). Operators at batch 1 take well under that, so the
caller's team, still spinning after a full-width stage, takes the cores from the
1-thread groups of the next stage. With GOMP_SPINCOUNT=10000 the searched schedule of
Inception-v3 (batch 1, 2 threads) ran end to end in 67.4 ms against 92.7 ms with the
default (sequential: 59.1 vs 62.5 ms; greedy 104 vs 140 ms). Processes that run IOS
schedules therefore start with `OPENMP_ENV` (libgomp reads it once, when it loads).
"""

from __future__ import annotations

import functools
import os
import queue
import threading
import time
import warnings
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Sequence

import torch
from torch import fx, nn
from torch.nn import functional as F

from .codegen import compile_group
from .openmp import OPENMP_ENV, openmp_env  # noqa: F401 (defined without torch, for commands; used from here too)
from .schedule import Schedule


@contextmanager
def caller_threads(threads: int):
    """The calling thread runs full-width stages: give it `threads` intra-op threads for a while."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _Worker:
    """A thread pinned to `cores` with len(cores) intra-op threads, running submitted calls."""

    def __init__(self, cores: tuple[int, ...]):
        self.cores = cores
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"ios-worker-{cores}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        os.sched_setaffinity(0, self.cores)
        torch.set_num_threads(len(self.cores))
        with torch.inference_mode():  # grad mode is per thread: workers only ever infer
            self._serve()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

    def submit(self, fn) -> Future:
        future: Future = Future()
        self._jobs.put((fn, future))
        return future

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()


class WorkerSet:
    """Workers by core set, created on first use and kept."""

    def __init__(self, cores: Sequence[int]):
        self.cores = tuple(cores)
        self._workers: dict[tuple[int, ...], _Worker] = {}

    def blocks(self, split: Sequence[int]) -> list[tuple[int, ...]]:
        """Contiguous core blocks for a thread split (more groups than cores: they share)."""
        blocks, start = [], 0
        for threads in split:
            block = self.cores[start:start + threads] or self.cores[-threads:]
            blocks.append(tuple(block))
            start += threads
        return blocks

    def run(self, calls: Sequence, split: Sequence[int]) -> list:
        """Run calls[i] with split[i] threads, all at once; return their results in order.
        One call on every core runs on the calling thread itself (see the module docstring)."""
        if len(calls) == 1 and split[0] >= len(self.cores):
            return [calls[0]()]
        futures = [self.worker(block).submit(call) for call, block in zip(calls, self.blocks(split))]
        return [f.result() for f in futures]

    def worker(self, cores: tuple[int, ...]) -> _Worker:
        if cores not in self._workers:
            self._workers[cores] = _Worker(cores)
        return self._workers[cores]

    def close(self) -> None:
        for worker in self._workers.values():
            worker.stop()
        self._workers.clear()


def run_node(gm: fx.GraphModule, node: fx.Node, env: dict) -> None:
    """Compute one fx node from the values in env (what fx.Interpreter does, minus its overhead)."""
    args = fx.node.map_arg(node.args, env.__getitem__)
    kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
    if node.op == "call_module":
        env[node] = gm.get_submodule(node.target)(*args, **kwargs)
    elif node.op == "call_function":
        env[node] = node.target(*args, **kwargs)
    elif node.op == "call_method":
        env[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
    elif node.op == "get_attr":  # a dotted path into submodules, e.g. "stages.0.nodes.5.weight"
        env[node] = functools.reduce(getattr, node.target.split("."), gm)
    else:
        raise ValueError(f"cannot run fx node {node.name} ({node.op})")


# ---- merged convolutions ------------------------------------------------------------------------

def mergeable(convs: Sequence[nn.Module]) -> bool:
    """Convolutions that can become one wider convolution: 2-d, same input channels,
    stride, dilation 1, no groups, odd kernels with 'same' padding (so a smaller kernel
    zero-padded to the largest gives the same outputs)."""
    if len(convs) < 2 or not all(type(c) is nn.Conv2d for c in convs):
        return False
    first = convs[0]
    for conv in convs:
        if (conv.in_channels, conv.stride, conv.groups, conv.dilation, conv.padding_mode) != \
                (first.in_channels, first.stride, 1, (1, 1), "zeros"):
            return False
        kh, kw = conv.kernel_size
        if kh % 2 == 0 or kw % 2 == 0 or conv.padding != (kh // 2, kw // 2):
            return False
    return True


class MergedConv(nn.Module):
    """Several convolutions of one input as one convolution; forward returns each output."""

    def __init__(self, convs: Sequence[nn.Conv2d]):
        super().__init__()
        kh = max(c.kernel_size[0] for c in convs)
        kw = max(c.kernel_size[1] for c in convs)
        weights, biases = [], []
        for conv in convs:
            dh, dw = (kh - conv.kernel_size[0]) // 2, (kw - conv.kernel_size[1]) // 2
            weights.append(F.pad(conv.weight.detach(), (dw, dw, dh, dh)))  # centred zero padding
            biases.append(conv.bias.detach() if conv.bias is not None else torch.zeros(conv.out_channels))
        self.register_buffer("weight", torch.cat(weights))
        self.register_buffer("bias", torch.cat(biases))
        self.stride, self.padding = convs[0].stride, (kh // 2, kw // 2)
        self.splits = [c.out_channels for c in convs]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.split(F.conv2d(x, self.weight, self.bias, self.stride, self.padding), self.splits, dim=1)


class MergeStage:
    """Operators that start with a convolution of the same tensor: one merged convolution,
    then each operator's remaining nodes (its batch norm, activation, ...), compiled."""

    def __init__(self, gm: fx.GraphModule, groups: Sequence[Sequence[fx.Node]], merged: MergedConv):
        self.groups, self.merged = groups, merged
        self.source = groups[0][0].args[0]
        self.tails = [compile_group(gm, group[1:]) for group in groups if len(group) > 1]

    @classmethod
    def build(cls, gm: fx.GraphModule, groups: Sequence[Sequence[fx.Node]]) -> "MergeStage | None":
        heads = [g[0] for g in groups]
        if any(n.op != "call_module" or len(n.args) != 1 for n in heads) or len({n.args[0] for n in heads}) != 1:
            return None
        convs = [gm.get_submodule(n.target) for n in heads]
        return cls(gm, groups, MergedConv(convs)) if mergeable(convs) else None

    def __call__(self, env: dict) -> None:
        env.update(zip((g[0] for g in self.groups), self.merged(env[self.source])))
        for tail in self.tails:
            tail.run(env)


# ---- the compiled module ------------------------------------------------------------------------

class ScheduledModule(nn.Module):
    """The model run stage by stage as the schedule says; callable like the original."""

    def __init__(self, gm: fx.GraphModule, schedule: Schedule, cores: Sequence[int] | None = None,
                 fuse: bool = True):
        super().__init__()
        self.gm, self.schedule = gm, schedule
        nodes = {n.name: n for n in gm.graph.nodes}
        self._placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self._attrs = [n for n in gm.graph.nodes if n.op == "get_attr"]
        self._output = next(n for n in gm.graph.nodes if n.op == "output")
        scheduled = [name for stage in schedule.stages for group in stage.groups for name in group]
        compute = [n.name for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]
        if sorted(scheduled) != sorted(compute):
            missing = sorted(set(compute) - set(scheduled))[:3]
            raise ValueError(f"schedule does not cover the graph exactly once (e.g. missing {missing})")
        steps = [(stage.kind, [[nodes[name] for name in group] for group in stage.groups], tuple(stage.threads))
                 for stage in schedule.stages]
        # off only to measure what a stage costs (tests/test_ios_codegen.py)
        steps = _fuse_full_width(steps, schedule.threads) if fuse else [(*s, [i]) for i, s in enumerate(steps)]
        self._stages = [self._compile(gm, kind, groups, extra) for kind, groups, extra, _ in steps]
        self.step_stages = [indices for *_, indices in steps]  # the schedule's stages each step runs
        self.step_kinds = [(kind, split) for kind, _, split, _ in steps]  # each step's kind and thread split
        self._release = self._last_uses([[n for group in groups for n in group] for _, groups, _, _ in steps])
        cores = tuple(cores if cores is not None else sorted(os.sched_getaffinity(0))[:schedule.threads])
        self.workers = WorkerSet(cores)
        self._warned = False
        # One op per stage with every thread is plain PyTorch: run the graph itself, no hand-offs
        # (set it False to time the executor's own path anyway, as tests/test_ios_codegen.py does).
        self.plain = len(steps) == 1 and steps[0][0] == "parallel" and steps[0][2] == (schedule.threads,)

    @staticmethod
    def _compile(gm: fx.GraphModule, kind: str, groups: list[list[fx.Node]], threads: tuple[int, ...]):
        if kind == "merge":
            merge = MergeStage.build(gm, groups)
            if merge is None:
                raise ValueError(f"merge stage {[g[0].name for g in groups]} cannot be merged")
            return "merge", merge, threads
        return "parallel", [compile_group(gm, g) for g in groups], threads

    def _last_uses(self, steps: list[list[fx.Node]]) -> list[list[fx.Node]]:
        """For each step, the values no later step reads. Dropping them as soon as possible
        lets the allocator reuse their memory while it is in cache, as the plain graph does:
        keeping every intermediate to the end made the staged Inception-v3 1.6x slower."""
        step_of = {node: i for i, step in enumerate(steps) for node in step}
        release: list[list[fx.Node]] = [[] for _ in steps]
        for node in self.gm.graph.nodes:
            if node.op == "output" or any(user.op == "output" for user in node.users):
                continue
            uses = [step_of[user] for user in node.users] + [step_of.get(node, 0)]
            release[max(uses)].append(node)
        return release

    def forward(self, *args):
        if torch.get_num_threads() != self.schedule.threads and not self._warned:
            self._warned = True
            warnings.warn(f"IOS schedule for {self.schedule.threads} threads called from a thread with "
                          f"{torch.get_num_threads()}: its full-width stages run with the caller's threads",
                          stacklevel=2)
        if self.plain:
            return self.gm(*args)
        return self._run(args, None)

    def step_times(self, *args) -> list[float]:
        """One run, timing each step (ms): a step is a stage, or a stretch of full-width stages
        run as one (`step_stages` says which)."""
        times: list[float] = []
        self._run(args, times)
        return times

    def _run(self, args: tuple, times: list | None):
        env: dict = dict(zip(self._placeholders, args))
        for node in self._attrs:
            run_node(self.gm, node, env)
        full = (self.schedule.threads,)
        for (kind, groups, extra), done in zip(self._stages, self._release):
            start = time.perf_counter() if times is not None else 0.0
            if kind == "merge":
                self.workers.run([lambda m=groups: m(env)], extra)
            elif extra == full:  # one group on every core: on this thread, no hand-off (WorkerSet.run)
                groups[0].run(env)
            else:
                self.workers.run([lambda g=g: g.run(env) for g in groups], extra)
            for node in done:
                env.pop(node, None)
            if times is not None:
                times.append((time.perf_counter() - start) * 1e3)
        return fx.node.map_arg(self._output.args[0], env.__getitem__)

    def close(self) -> None:
        self.workers.close()


def _fuse_full_width(steps: list, threads: int) -> list:
    """Consecutive stages of one group on every thread run one after another on the calling
    thread anyway: join them into one group, so they become one generated function and cost
    one call, not one per stage (a sequential stretch of a schedule then runs as plain code).
    Each step is (kind, groups, split, indices of the stages it runs)."""
    fused: list = []
    for index, (kind, groups, split) in enumerate(steps):
        alone = kind == "parallel" and len(groups) == 1 and split == (threads,)
        if alone and fused and fused[-1][4]:
            fused[-1][1][0].extend(groups[0])
            fused[-1][3].append(index)
        else:
            fused.append([kind, [list(g) for g in groups], split, [index], alone])
    return [(kind, groups, split, indices) for kind, groups, split, indices, _ in fused]


def time_call(fn, warmup: int = 2, repeats: int = 5, limit: float = float("inf"), first: int = 2,
              setup=None) -> float:
    """Median wall time of fn() in ms; once the fastest of the `first` timed runs is above
    `limit` (ms), that time, without the remaining runs: the caller only needs to know it is above.
    `setup()`, if given, runs untimed before every run."""
    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    samples = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
        if len(samples) == first and min(samples) > limit:
            return min(samples)
    samples.sort()
    return samples[len(samples) // 2]
