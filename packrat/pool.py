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
from dataclasses import dataclass
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
    batch: int  # planned sub-batch; also the capacity of its shared-memory segments
    cores: tuple[int, ...]


@dataclass(frozen=True)
class ModelConfig:
    model: str  # zoo name, TorchScript file or package.module:factory (packrat.models.resolve)
    input_shape: tuple[int, ...] | None = None
    graph_mode: bool = True


def split_sizes(n: int, planned: Sequence[int]) -> list[int]:
    """How many of `n` samples each instance runs, given the planned batch sizes.

    n ≥ Σplanned: each gets its planned share (the caller chunks the rest). Otherwise
    shares are proportional to the plan (largest remainders first), with at least one
    sample for every instance while there are samples to give, so no core idles
    when there is work for it; no instance ever gets more than its planned batch.
    """
    total = sum(planned)
    if n >= total:
        return list(planned)
    sizes = [0] * len(planned)
    # One each first, biggest instances first, when there are fewer samples than instances.
    for i in sorted(range(len(planned)), key=lambda i: -planned[i])[:n]:
        sizes[i] = 1
    left = n - sum(sizes)
    spare = [p - s for p, s in zip(planned, sizes)]
    spare_total = sum(spare)
    if left and spare_total:
        exact = [left * s / spare_total for s in spare]
        extra = [int(e) for e in exact]
        order = sorted(range(len(planned)), key=lambda i: exact[i] - extra[i], reverse=True)
        for i in order[: left - sum(extra)]:
            extra[i] += 1
        sizes = [s + e for s, e in zip(sizes, extra)]
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
    model, config, input_segment = conn.recv()
    os.sched_setaffinity(0, config.cores)  # before any parallel region starts OpenMP's threads
    torch.set_num_threads(config.threads)
    torch.set_num_interop_threads(1)
    from .models import prepare, resolve

    try:
        spec = resolve(model.model, model.input_shape)
        module, example, mode = prepare(spec, config.batch, graph_mode=model.graph_mode)
        with torch.inference_mode():
            _warm_up(module, example)
            sample = module(example[:1])
        in_shape = (config.batch, *spec.input_shape)
        inputs = _view(_attach(input_segment, _numel(in_shape) * spec.input_dtype.itemsize), spec.input_dtype, in_shape)
        out_shape = (config.batch, *sample.shape[1:])
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
                 input_shape: tuple[int, ...], input_dtype: torch.dtype):
        self.index, self.config = index, config
        # A fresh interpreter (not fork: that would copy the server's threads and torch
        # state; not multiprocessing's spawn: that re-imports the caller's __main__).
        parent_sock, child_sock = socket.socketpair()
        self.conn = Connection(parent_sock.detach())
        nbytes = config.batch * _numel(input_shape) * input_dtype.itemsize
        self.input_shm = SharedMemory(create=True, size=max(nbytes, 1))
        self.inputs = _view(self.input_shm.buf, input_dtype, (config.batch, *input_shape))
        self.output_shm: SharedMemory | None = None
        self.ready = False  # set once the instance has its output segment and takes work
        self.outputs: torch.Tensor | None = None
        child_fd = child_sock.detach()
        self.process = subprocess.Popen([sys.executable, "-m", "packrat.pool", str(child_fd)], pass_fds=(child_fd,))
        os.close(child_fd)  # our copy: the socket must close when the child exits
        self.conn.send((model, config, self.input_shm.name))

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
        shape = (self.config.batch, *sample_shape)
        self.output_shm = SharedMemory(create=True, size=max(_numel(shape) * dtype.itemsize, 1))
        self.outputs = _view(self.output_shm.buf, dtype, shape)
        self.conn.send(("output", self.output_shm.name))
        self.ready = True
        return mode

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
        self.model, self.configs = model, list(instances)
        self.input_shape, self.input_dtype = tuple(spec.input_shape), spec.input_dtype
        self.start_timeout = start_timeout
        self.respawns = 0
        self.last_compute_ms = 0.0  # slowest instance's model time in the last round (overhead = wall − this)
        self.mode = ""
        self._lock = threading.Lock()  # one batch at a time
        self._swap = threading.Lock()  # guards self._instances against the respawn threads
        self._closed = False
        self._instances: list[_Instance] = []
        try:
            self._instances = [self._spawn(i) for i in range(len(self.configs))]
            self.mode = [inst.wait_ready(start_timeout) for inst in self._instances][0]
        except BaseException:
            self.close()
            raise
        log.info("pool ready: %s (%s mode)", self.describe(), self.mode)

    @classmethod
    def from_plan(cls, model: ModelConfig, plan, **kwargs) -> "InstancePool":
        """A pool for a planner.Plan: one instance per planned ⟨threads, batch, cores⟩."""
        return cls(model, [InstanceConfig(i.threads, i.batch, tuple(i.cores)) for i in plan.instances], **kwargs)

    @property
    def batch(self) -> int:
        return sum(c.batch for c in self.configs)

    def describe(self) -> str:
        return ", ".join(f"⟨{c.threads} threads, batch {c.batch}, cores {list(c.cores)}⟩" for c in self.configs)

    def _spawn(self, index: int) -> _Instance:
        return _Instance(index, self.model, self.configs[index], self.input_shape, self.input_dtype)

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
                chunk = inputs[start:start + sum(inst.config.batch for inst in instances)]
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
        sizes = split_sizes(len(chunk), [inst.config.batch for inst in instances])
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
            inst = max(self._ready_instances(), key=lambda i: i.config.batch)
            pieces = torch.split(part, inst.config.batch)
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
            fresh = self._spawn(dead.index)
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

    # ---- shutdown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every instance process and free the shared memory; idempotent."""
        self._closed = True
        with self._swap:
            instances, self._instances = self._instances, []
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
