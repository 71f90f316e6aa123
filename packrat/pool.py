"""The instance pool: one pinned process per planned instance, fed through shared memory.

Each instance is a fresh ``python -m packrat.pool`` process pinned (``os.sched_setaffinity``) to its own cores,
with its own intra-op thread count and one inter-op thread. It loads the model,
warms it up, and then loops: read ``n`` samples from its input segment, run the model,
write the outputs to its output segment. The parent owns both segments (POSIX shared
memory it creates and unlinks); only ``("run", n)`` / ``("done", n)`` cross the pipe,
so no tensor is pickled per request.

``run(batch)`` splits the batch across the instances in proportion to their planned
batch sizes, runs the parts concurrently, and concatenates the outputs in input
order. An instance that dies mid-batch (killed, out of memory) is noticed when its end
of the socket pair closes: its part is run again on a live instance (or on its replacement if
none is left) and the instance is respawned in the background. Each input sample is
answered exactly once.
"""

from __future__ import annotations

import logging
import mmap
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from multiprocessing.shared_memory import SharedMemory
from typing import Sequence

import torch

log = logging.getLogger("packrat.pool")


class PoolError(RuntimeError):
    """An instance could not start, or the model failed on a batch."""


@dataclass(frozen=True)
class InstanceConfig:
    threads: int
    batch: int  # planned sub-batch: the share of a full batch this instance runs
    cores: tuple[int, ...]
    capacity: int = 0  # most samples it can take at once (its shared memory); at least `batch`

    @property
    def slots(self) -> int:
        return max(self.capacity, self.batch)


@dataclass(frozen=True)
class ModelConfig:
    model: str  # zoo name, TorchScript file or package.module:factory (packrat.models.resolve)
    input_shape: tuple[int, ...] | None = None
    graph_mode: bool = True
    ios_cache: str | None = None  # run each instance by its IOS schedule, cached in this directory


def configs_for(plan, capacity: int = 0) -> list[InstanceConfig]:
    """One instance per planned ⟨threads, batch, cores⟩ of a planner.Plan; `capacity` lets
    each take up to that many samples (e.g. TorchServe's batch size, when the plan is for less)."""
    return [InstanceConfig(i.threads, i.batch, tuple(i.cores), capacity) for i in plan.instances]


def split_sizes(n: int, planned: Sequence[int], capacities: Sequence[int] | None = None) -> list[int]:
    """How many of `n` samples each instance runs, given the planned batch sizes.

    Shares are proportional to the plan (largest remainders first). Below the planned
    total, every instance gets at least one sample while there are samples to give, so
    no core idles when there is work for it, and none gets more than its planned batch.
    Above it, shares grow in proportion up to each instance's capacity (the caller
    never passes more than the capacities hold).
    """
    total = sum(planned)
    if n >= total:
        return _proportional(n, planned, capacities or [n] * len(planned))
    sizes = [0] * len(planned)
    for i in sorted(range(len(planned)), key=lambda i: -planned[i])[:n]:  # one each, biggest first
        sizes[i] = 1
    extra = _proportional(n - sum(sizes), [p - s for p, s in zip(planned, sizes)], None)
    return [s + e for s, e in zip(sizes, extra)]


def _proportional(n: int, weights: Sequence[int], caps: Sequence[int] | None) -> list[int]:
    """n split in proportion to weights (largest remainders), never above caps."""
    caps = list(caps) if caps is not None else list(weights)
    sizes = [0] * len(weights)
    left = n
    while left > 0:
        open_ = [i for i in range(len(weights)) if sizes[i] < caps[i] and weights[i] > 0]
        if not open_:
            raise ValueError(f"{n} samples do not fit capacities {caps}")
        weight = sum(weights[i] for i in open_)
        exact = {i: left * weights[i] / weight for i in open_}
        share = {i: min(int(exact[i]), caps[i] - sizes[i]) for i in open_}
        for i in sorted(open_, key=lambda i: exact[i] - int(exact[i]), reverse=True)[: left - sum(share.values())]:
            if share[i] < caps[i] - sizes[i]:
                share[i] += 1
        for i in open_:
            sizes[i] += share[i]
        left = n - sum(sizes)
    return sizes


# ---- the instance process ---------------------------------------------------------------------

def _attach(name: str, size: int) -> mmap.mmap:
    """Map a parent-owned segment without registering it with a resource tracker
    (Python < 3.13 would otherwise unlink it when this process exits)."""
    with open(f"/dev/shm/{name.lstrip('/')}", "r+b") as file:
        return mmap.mmap(file.fileno(), size)


def _view(buffer, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.frombuffer(buffer, dtype=dtype, count=_numel(shape)).view(shape)


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def _warm_up(module, example: torch.Tensor) -> None:
    """Run every batch size the instance will see soon (halving down to 1), so
    TorchScript's shape specialisation happens here, not on a live request."""
    size = example.shape[0]
    while size >= 1:
        module(example[:size])
        module(example[:size])
        size //= 2


def _instance_main(conn: Connection) -> None:
    model, config, input_segment, nice = conn.recv()
    os.sched_setaffinity(0, config.cores)  # before any parallel region starts OpenMP's threads
    if nice:
        os.nice(nice)  # warming up beside a live pool: yield its cores to it (threads inherit this)
    torch.set_num_threads(config.threads)
    torch.set_num_interop_threads(1)
    from .models import prepare, resolve

    try:
        spec = resolve(model.model, model.input_shape)
        if model.ios_cache:
            from ios_scheduler.cache import prepare_ios

            module, example, mode = prepare_ios(spec, config.batch, config.threads, model.ios_cache)
        else:
            module, example, mode = prepare(spec, config.batch, graph_mode=model.graph_mode)
        with torch.inference_mode():
            _warm_up(module, example)
            sample = module(example[:1])
        in_shape = (config.slots, *spec.input_shape)
        inputs = _view(_attach(input_segment, _numel(in_shape) * spec.input_dtype.itemsize), spec.input_dtype, in_shape)
        out_shape = (config.slots, *sample.shape[1:])
        conn.send(("ready", tuple(sample.shape[1:]), str(sample.dtype).removeprefix("torch."), mode))
        _, output_segment = conn.recv()
        outputs = _view(_attach(output_segment, _numel(out_shape) * sample.dtype.itemsize), sample.dtype, out_shape)
    except Exception as exc:  # report why, then exit: the parent decides what to do
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone: nobody to answer
            return
        if message[0] == "stop":
            return
        n = message[1]
        try:
            started = time.perf_counter()
            with torch.inference_mode():
                outputs[:n].copy_(module(inputs[:n]))
            conn.send(("done", n, (time.perf_counter() - started) * 1e3))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


# ---- the parent side --------------------------------------------------------------------------

class _Instance:
    """Parent-side handle of one instance process and its two shared-memory segments."""

    def __init__(self, index: int, model: ModelConfig, config: InstanceConfig,
                 input_shape: tuple[int, ...], input_dtype: torch.dtype, nice: int = 0):
        self.index, self.config = index, config
        # A fresh interpreter (not fork: that would copy the server's threads and torch
        # state; not multiprocessing's spawn: that re-imports the caller's __main__).
        parent_sock, child_sock = socket.socketpair()
        self.conn = Connection(parent_sock.detach())
        nbytes = config.slots * _numel(input_shape) * input_dtype.itemsize
        self.input_shm = SharedMemory(create=True, size=max(nbytes, 1))
        self.inputs = _view(self.input_shm.buf, input_dtype, (config.slots, *input_shape))
        self.output_shm: SharedMemory | None = None
        self.ready = False  # set once the instance has its output segment and takes work
        self.outputs: torch.Tensor | None = None
        child_fd = child_sock.detach()
        env = None
        if model.ios_cache:
            from ios_scheduler.runtime import openmp_env

            env = openmp_env()
        self.process = subprocess.Popen([sys.executable, "-m", "packrat.pool", str(child_fd)], pass_fds=(child_fd,),
                                        env=env)
        os.close(child_fd)  # our copy: the socket must close when the child exits
        self.conn.send((model, config, self.input_shm.name, nice))

    def wait_ready(self, timeout: float) -> str:
        """Block until the instance has loaded and warmed up its model; returns its mode."""
        if not self.conn.poll(timeout):
            raise PoolError(f"instance {self.index} did not start within {timeout:.0f} s")
        try:
            message = self.conn.recv()
        except EOFError:
            raise PoolError(f"instance {self.index} exited while starting (exit code {self.process.poll()})") from None
        if message[0] == "failed":
            raise PoolError(f"instance {self.index} failed to start: {message[1]}")
        _, sample_shape, dtype_name, mode = message
        dtype = getattr(torch, dtype_name)
        shape = (self.config.slots, *sample_shape)
        self.output_shm = SharedMemory(create=True, size=max(_numel(shape) * dtype.itemsize, 1))
        self.outputs = _view(self.output_shm.buf, dtype, shape)
        self.conn.send(("output", self.output_shm.name))
        self.ready = True
        return mode

    def restore_priority(self) -> bool:
        """Back to normal priority after a low-priority warm-up (every thread: Linux
        keeps a nice value per thread). Lowering nice needs CAP_SYS_NICE."""
        import psutil

        try:
            for thread in psutil.Process(self.process.pid).threads():
                os.setpriority(os.PRIO_PROCESS, thread.id, 0)
            return True
        except (PermissionError, psutil.Error, ProcessLookupError):
            return False

    def receive(self) -> tuple | None:
        """The instance's answer, or None if it died without one."""
        try:
            return self.conn.recv() if self.conn.poll() else None
        except (EOFError, OSError):
            return None

    def submit(self, part: torch.Tensor) -> None:
        self.inputs[: len(part)].copy_(part)
        self.conn.send(("run", len(part)))

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self, timeout: float = 5.0) -> None:
        self.ready = False
        try:
            self.conn.send(("stop",))
            self.process.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        self.conn.close()
        self.inputs = self.outputs = None  # release the views before closing the segments
        for shm in (self.input_shm, self.output_shm):
            if shm is not None:
                shm.close()
                shm.unlink()


class InstancePool:
    """Pinned model instances that together run one batch as fast as the plan allows.

    Use as a context manager, or call close(); run() is safe to call from several threads
    (batches are run one after another).
    """

    def __init__(self, model: ModelConfig, instances: Sequence[InstanceConfig], start_timeout: float = 600.0):
        from .models import resolve

        if not instances:
            raise ValueError("a pool needs at least one instance")
        cores = [c for inst in instances for c in inst.cores]
        if len(cores) != len(set(cores)):
            raise ValueError(f"instances share cores: {[list(i.cores) for i in instances]}")
        spec = resolve(model.model, model.input_shape)
        self.model = model
        self.input_shape, self.input_dtype = tuple(spec.input_shape), spec.input_dtype
        self.start_timeout = start_timeout
        self.respawns = 0
        self.last_compute_ms = 0.0  # slowest instance's model time in the last round (overhead = wall − this)
        self.mode = ""
        self._lock = threading.Lock()  # one batch at a time
        self._swap = threading.Lock()  # guards self._instances against the respawn threads
        self._closed = False
        self._instances: list[_Instance] = []
        self._parked: list[_Instance] = []  # retired by the last switch; reused if the plan comes back
        try:
            self._instances = [self._spawn(config, i) for i, config in enumerate(instances)]
            self.mode = [inst.wait_ready(start_timeout) for inst in self._instances][0]
        except BaseException:
            self.close()
            raise
        log.info("pool ready: %s (%s mode)", self.describe(), self.mode)

    @classmethod
    def from_plan(cls, model: ModelConfig, plan, capacity: int = 0, **kwargs) -> "InstancePool":
        """A pool for a planner.Plan: one instance per planned ⟨threads, batch, cores⟩."""
        return cls(model, configs_for(plan, capacity), **kwargs)

    @property
    def configs(self) -> list[InstanceConfig]:
        with self._swap:
            return [inst.config for inst in self._instances]

    @property
    def batch(self) -> int:
        return sum(c.batch for c in self.configs)

    def describe(self) -> str:
        return ", ".join(f"⟨{c.threads} threads, batch {c.batch}, cores {list(c.cores)}⟩" for c in self.configs)

    def _spawn(self, config: InstanceConfig, index: int, nice: int = 0) -> _Instance:
        return _Instance(index, self.model, config, self.input_shape, self.input_dtype, nice)

    # ---- running a batch ----------------------------------------------------------------------

    def run(self, inputs: torch.Tensor) -> torch.Tensor:
        """Outputs for `inputs` (batch first), in order; batches larger than the plan run in rounds."""
        if tuple(inputs.shape[1:]) != self.input_shape or inputs.dtype != self.input_dtype:
            raise ValueError(f"inputs must be {self.input_dtype} of shape (n, {', '.join(map(str, self.input_shape))}),"
                             f" got {inputs.dtype} {tuple(inputs.shape)}")
        if len(inputs) == 0:
            raise ValueError("empty batch")
        with self._lock:
            outputs, start = [], 0
            while start < len(inputs):  # more than the ready instances hold: one round at a time
                instances = self._ready_instances()
                chunk = inputs[start:start + sum(inst.config.slots for inst in instances)]
                outputs.append(self._run_chunk(chunk, instances))
                start += len(chunk)
            return torch.cat(outputs)

    def _ready_instances(self) -> list[_Instance]:
        """The instances able to take work now (a respawning one is not, until warmed up)."""
        while True:
            with self._swap:
                ready = [inst for inst in self._instances if inst.ready and inst.alive]
            if ready:
                return ready
            if self._closed:
                raise PoolError("pool is closed")
            time.sleep(0.02)

    def _run_chunk(self, chunk: torch.Tensor, instances: list[_Instance]) -> torch.Tensor:
        sizes = split_sizes(len(chunk), [inst.config.batch for inst in instances],
                            [inst.config.slots for inst in instances])
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        work = [(inst, chunk[bounds[i]:bounds[i + 1]]) for i, inst in enumerate(instances) if sizes[i]]
        outputs = self._execute(work)
        for i, (_, part) in enumerate(work):
            if outputs[i] is None:
                outputs[i] = self._redo(part)
        return torch.cat(outputs)

    def _execute(self, work: list[tuple[_Instance, torch.Tensor]]) -> list[torch.Tensor | None]:
        """Run each part on its instance concurrently. A part whose instance died comes
        back as None (the instance is being respawned); a model error raises PoolError."""
        outputs: list[torch.Tensor | None] = [None] * len(work)
        self.last_compute_ms = 0.0
        waiting: dict[object, int] = {}
        for index, (inst, part) in enumerate(work):
            try:
                inst.submit(part)
            except OSError:  # the pipe is already broken: the instance is gone
                continue
            waiting[inst.conn] = index  # readable on an answer, and on EOF if the instance dies
        error = None
        while waiting:
            for handle in wait(list(waiting)):
                index = waiting.pop(handle)
                inst, part = work[index]
                message = inst.receive()
                if message and message[0] == "done":
                    outputs[index] = inst.outputs[: len(part)].clone()
                    self.last_compute_ms = max(self.last_compute_ms, message[2])
                elif message:
                    error = PoolError(f"model failed on instance {inst.index}: {message[1]}")
        for index, (inst, _) in enumerate(work):
            if outputs[index] is None and error is None:
                self._replace(inst)
        if error is not None:
            raise error
        return outputs

    def _redo(self, part: torch.Tensor) -> torch.Tensor:
        """Run a dead instance's part again on a live instance (its replacement if none is)."""
        while True:
            inst = max(self._ready_instances(), key=lambda i: i.config.slots)
            pieces = torch.split(part, inst.config.slots)
            outputs = [self._execute([(inst, piece)])[0] for piece in pieces]
            if all(out is not None for out in outputs):
                return torch.cat(outputs)
            # that one died too: go round again with whoever is left

    def _replace(self, dead: _Instance) -> None:
        """Respawn a dead instance in the background; the pool keeps serving meanwhile."""
        log.warning("instance %d (cores %s) died with exit code %s; respawning",
                    dead.index, list(dead.config.cores), dead.process.poll())
        with self._swap:
            if dead not in self._instances:
                return
            position = self._instances.index(dead)
            fresh = self._spawn(dead.config, dead.index)
            self._instances[position] = fresh
            self.respawns += 1
        dead.close(timeout=0)
        threading.Thread(target=self._finish_respawn, args=(fresh,), daemon=True).start()

    def _finish_respawn(self, fresh: _Instance) -> None:
        try:
            fresh.wait_ready(self.start_timeout)
            log.info("instance %d respawned", fresh.index)
        except (PoolError, OSError) as exc:
            if not self._closed:  # a pool closing under a respawn is not news
                log.error("respawning instance %d failed: %s", fresh.index, exc)

    # ---- reconfiguration ------------------------------------------------------------------------

    def reconfigure(self, configs: Sequence[InstanceConfig], warmup_nice: int = 10) -> dict[str, int]:
        """Switch to new instances without stopping service.

        Instances whose threads and cores stay (and whose memory holds the new batch) are
        kept and only get their new share of the batch; so are instances parked by the
        previous switch, which makes switching back and forth between two plans instant.
        The others are started beside the live ones at low priority, warmed up, and swapped
        in between two batches. The instances this switch retires are parked (idle, blocked
        on their pipe: memory but no CPU) until the next switch that retires others.
        Thread counts of live instances never change. If a new instance fails to start,
        the pool is left as it was and PoolError raised.
        """
        cores = [c for config in configs for c in config.cores]
        if len(cores) != len(set(cores)):
            raise ValueError(f"instances share cores: {[list(c.cores) for c in configs]}")
        with self._swap:
            active, parked = list(self._instances), list(self._parked)
        kept = self._match(configs, active + parked)
        fresh: dict[int, _Instance] = {}
        try:
            for position, config in enumerate(configs):
                if position not in kept:
                    fresh[position] = self._spawn(config, position, warmup_nice)
            for inst in fresh.values():
                inst.wait_ready(self.start_timeout)
        except BaseException:
            for inst in fresh.values():
                inst.close()
            raise
        if fresh and not all(inst.restore_priority() for inst in fresh.values()):
            log.warning("new instances keep nice %d: lowering it back needs CAP_SYS_NICE", warmup_nice)
        reused = set(map(id, kept.values()))
        retired = [inst for inst in active if id(inst) not in reused]
        still_parked = [inst for inst in parked if id(inst) not in reused]
        with self._lock:  # between two batches: nothing is running on the old instances
            with self._swap:
                for position, inst in kept.items():
                    inst.config = replace(configs[position], capacity=inst.config.slots)
                    inst.index = position
                self._instances = [kept.get(p) or fresh[p] for p in range(len(configs))]
                if retired:  # park this switch's leftovers; the older parked ones go
                    self._parked, stopped = retired, still_parked
                else:
                    self._parked, stopped = still_parked, []
        for inst in stopped:
            inst.close()
        counts = {"kept": len(kept), "started": len(fresh), "parked": len(retired), "stopped": len(stopped)}
        log.info("pool reconfigured: %s (%s)", self.describe(), ", ".join(f"{v} {k}" for k, v in counts.items()))
        return counts

    @staticmethod
    def _match(configs: Sequence[InstanceConfig], candidates: list[_Instance]) -> dict[int, _Instance]:
        """Position in `configs` -> a ready instance with the same threads and cores that can hold its batch."""
        kept: dict[int, _Instance] = {}
        for position, config in enumerate(configs):
            match = next((inst for inst in candidates if inst.ready and inst.alive and inst not in kept.values()
                          and (inst.config.threads, inst.config.cores) == (config.threads, config.cores)
                          and inst.config.slots >= config.slots), None)
            if match is not None:
                kept[position] = match
        return kept

    # ---- shutdown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every instance process and free the shared memory; idempotent."""
        self._closed = True
        with self._swap:
            instances, self._instances, self._parked = self._instances + self._parked, [], []
        for inst in instances:
            inst.close()

    def pids(self) -> list[int]:
        with self._swap:
            return [inst.process.pid for inst in self._instances]

    def __enter__(self) -> "InstancePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":  # an instance process: python -m packrat.pool FD
    _instance_main(Connection(int(sys.argv[1])))
