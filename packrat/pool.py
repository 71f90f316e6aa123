"""The instance pool: one pinned process per planned instance, fed request bytes through shared memory.

Each instance is a fresh ``python -m packrat.pool`` process pinned (``os.sched_setaffinity``) to
its own cores, with its own intra-op thread count and one inter-op thread. It loads the model and
a ``codec.Codec``, warms up, and then loops: read its requests' bodies from its input segment
(POSIX shared memory the parent creates, grows and unlinks), decode each, run the model once on
the good ones, encode each answer, and send the answers back over its socket. Pre- and
post-processing (image decoding, tokenisation, top-5, labels) thus run on the instance's cores,
in parallel across instances; the caller only moves bytes. A request whose own decoding or
encoding fails is answered alone (4xx for bad input, 500 for ours); its batch-mates are not.

Dispatch is work-conserving. ``submit(request)`` queues one request and returns a future; a
dispatcher thread hands queued requests to the instances as they become idle, each taking up to
its planned share (``split_sizes`` over the idle instances; beyond the plan, up to its capacity
when the queue is longer). Requests reach the cores as they arrive and users desynchronise, so
one instance's batch runs while another's answers travel, and the threads of all instances
never exceed the cores. One refinement, measured (BENCHMARKS.md, dispatch modes): an idle
instance whose planned share has not all arrived waits up to ``gather_ms`` (30 ms) for the rest
before it starts. In a closed loop the requests of a wave arrive one by one, milliseconds apart;
starting on the first alone made a fat ⟨2 threads, batch 4⟩ instance run batches of one and
two, 1.1-1.4x slower at p50 than whole batches, while 30 ms recovered them (and a longer wait
gained nothing). Under a queue the share is always there and nothing waits.

Requests come from TorchServe's asynchronous worker mode: TorchServe hands the handler each
request as it arrives, without waiting for earlier ones to be answered, and the handler submits
it here (handlers/packrat_handler.py). The other way, a second TorchServe worker sharing these
instances, was not built: workers are separate processes, so the queue and the instances would
have to move into a third process, adding a hop per request, and each worker would still hand
over whole batches.

Failures: an instance that dies (killed, out of memory, a crash in a native decoder) is noticed
when its socket closes; its requests go back to the front of the queue and run on another
instance (a request that has taken three instances down with it is answered 500 instead), and the
instance is respawned in the background, retried with back-off (1 s doubling to 30 s), forever,
each failure logged. While no instance can run (every one dead and a respawn has failed, or none
ready for ``unavailable_after_s``), requests are answered 503 with the reason at once instead of
waiting; when an instance comes back, service resumes by itself. ``health()`` reports all this.
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
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.shared_memory import SharedMemory
from typing import Sequence

from .codec import CodecConfig

log = logging.getLogger("packrat.pool")

MIN_SEGMENT_BYTES = 1 << 20
MAX_ATTEMPTS = 3  # instance deaths one request may be part of before it is answered 500
BACKOFF_S = (1.0, 30.0)  # first and longest wait between respawn attempts
GATHER_MS = 30.0  # how long idle instances wait for their planned share to arrive (measured: BENCHMARKS.md)


class PoolError(RuntimeError):
    """An instance could not start, or the pool is closed."""


@dataclass(frozen=True)
class InstanceConfig:
    threads: int
    batch: int  # planned sub-batch: the share of a full batch this instance runs
    cores: tuple[int, ...]
    capacity: int = 0  # most requests it takes at once when the queue is long; at least `batch`

    @property
    def slots(self) -> int:
        return max(self.capacity, self.batch)


@dataclass(frozen=True)
class ModelConfig:
    model: str  # zoo name, TorchScript file or package.module:factory (packrat.models.resolve)
    input_shape: tuple[int, ...] | None = None
    graph_mode: bool = True
    ios_cache: str | None = None  # run each instance by its IOS schedule, cached in this directory


@dataclass(frozen=True)
class Request:
    body: bytes
    content_type: str | None = None


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes  # JSON
    reason: str = ""  # one line, for errors

    @classmethod
    def error(cls, status: int, reason: str) -> "Answer":
        from .inference import error

        return cls(*error(status, reason))

    @property
    def ok(self) -> bool:
        return self.status == 200


def configs_for(plan, capacity: int = 0) -> list[InstanceConfig]:
    """One instance per planned ⟨threads, batch, cores⟩ of a planner.Plan; `capacity` lets
    each take up to that many requests (e.g. TorchServe's batch size, when the plan is for less)."""
    return [InstanceConfig(i.threads, i.batch, tuple(i.cores), capacity) for i in plan.instances]


def split_sizes(n: int, planned: Sequence[int], capacities: Sequence[int] | None = None) -> list[int]:
    """How many of `n` requests each instance runs, given the planned batch sizes.

    Shares are proportional to the plan (largest remainders first). Below the planned
    total, every instance gets at least one request while there are requests to give, so
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
        return mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)


def _warm_up(module, example) -> None:
    """Run every batch size the instance will see soon (halving down to 1), so
    TorchScript's shape specialisation happens here, not on a live request."""
    size = example.shape[0]
    while size >= 1:
        module(example[:size])
        module(example[:size])
        size //= 2


def _load(model: ModelConfig, config: InstanceConfig):
    from .models import prepare, resolve

    spec = resolve(model.model, model.input_shape)
    if model.ios_cache:
        from ios_scheduler.cache import prepare_ios

        return prepare_ios(spec, config.batch, config.threads, model.ios_cache)
    return prepare(spec, config.batch, graph_mode=model.graph_mode)


def exit_with_parent(cleanup=None, interval_s: float = 0.5) -> None:
    """Exit this process when its parent is gone, after `cleanup()`. Instances use it to go even
    while still loading (they notice the parent's death on their socket only once they serve); the
    handler uses it because TorchServe's asynchronous worker keeps non-daemon threads blocked
    forever once Java has gone, so the worker, and with it the pool, would outlive `torchserve --stop`."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        try:
            if cleanup is not None:
                cleanup()
        finally:
            os._exit(0)

    threading.Thread(target=watch, daemon=True, name="packrat-parent-watch").start()


def _instance_main(conn: Connection) -> None:
    exit_with_parent()
    model, config, codec_config, nice = conn.recv()
    os.sched_setaffinity(0, config.cores)  # before any parallel region starts OpenMP's threads
    if nice:
        os.nice(nice)  # warming up beside a live pool: yield its cores to it (threads inherit this)
    import torch

    torch.set_num_threads(config.threads)
    torch.set_num_interop_threads(1)
    from .codec import Codec
    from .inference import answer_batch

    try:
        codec = Codec(codec_config)
        module, example, mode = _load(model, config)
        with torch.inference_mode():
            _warm_up(module, example)
        conn.send(("ready", mode))
    except Exception as exc:  # report why, then exit: the parent decides what to do
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    segment = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone: nobody to answer
            return
        if message[0] == "stop":
            return
        _, items, new_segment = message
        if new_segment:
            segment = _attach(*new_segment)
        started = time.perf_counter()
        answers = answer_batch(module, codec, [(segment[o:o + n], ct) for o, n, ct in items])
        conn.send(("answers", answers, (time.perf_counter() - started) * 1e3))


# ---- the parent side --------------------------------------------------------------------------

@dataclass
class _Job:
    request: Request
    future: Future
    queued_at: float = field(default_factory=time.monotonic)
    attempts: int = 0


def _resolve(job: _Job, answer: Answer) -> None:
    if not job.future.done():  # a request is answered once, even if its instance was given up on
        job.future.set_result(answer)


class _Instance:
    """Parent-side handle of one instance process, its input segment and the jobs it runs."""

    def __init__(self, index: int, model: ModelConfig, config: InstanceConfig, codec: CodecConfig, nice: int = 0):
        self.index, self.config = index, config
        self.ready = False  # set once the instance has loaded its model and takes work
        self.mode = ""
        self.jobs: list[_Job] = []
        self.segment: SharedMemory | None = None
        # A fresh interpreter (not fork: that would copy the server's threads and torch
        # state; not multiprocessing's spawn: that re-imports the caller's __main__).
        parent_sock, child_sock = socket.socketpair()
        self.conn = Connection(parent_sock.detach())
        child_fd = child_sock.detach()
        env = None
        if model.ios_cache:
            from ios_scheduler.runtime import openmp_env

            env = openmp_env()
        self.process = subprocess.Popen([sys.executable, "-m", "packrat.pool", str(child_fd)], pass_fds=(child_fd,),
                                        env=env)
        os.close(child_fd)  # our copy: the socket must close when the child exits
        self.conn.send((model, config, codec, nice))

    def wait_ready(self, timeout: float) -> str:
        """Block until the instance has loaded and warmed up its model; returns its mode."""
        if not self.conn.poll(timeout):
            raise PoolError(f"instance {self.index} did not start within {timeout:.0f} s")
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            raise PoolError(f"instance {self.index} exited while starting (exit code {self.process.poll()})") from None
        if message[0] == "failed":
            raise PoolError(f"instance {self.index} failed to start: {message[1]}")
        self.mode, self.ready = message[1], True
        return self.mode

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

    def submit(self, jobs: list[_Job]) -> None:
        """Write the bodies into the input segment (grown when they do not fit) and send their places."""
        needed = sum(len(job.request.body) for job in jobs)
        new_segment = None
        if self.segment is None or self.segment.size < needed:
            self._release_segment()
            self.segment = SharedMemory(create=True, size=max(MIN_SEGMENT_BYTES, 1 << (needed - 1).bit_length()))
            new_segment = (self.segment.name, self.segment.size)
        items, offset = [], 0
        for job in jobs:
            body = job.request.body
            self.segment.buf[offset:offset + len(body)] = body
            items.append((offset, len(body), job.request.content_type))
            offset += len(body)
        self.jobs = jobs
        self.conn.send(("infer", items, new_segment))

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def idle(self) -> bool:
        return self.ready and not self.jobs

    def _release_segment(self) -> None:
        if self.segment is not None:
            self.segment.close()
            self.segment.unlink()
            self.segment = None

    def close(self, timeout: float = 5.0) -> None:
        self.ready = False
        try:
            self.conn.send(("stop",))
            self.process.wait(timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        self.conn.close()
        self._release_segment()


@dataclass
class Health:
    instances: int
    ready: int
    respawning: int
    respawn_failures: int  # failed respawn attempts since start
    unavailable: str | None  # why requests are being refused now, or None
    queued: int
    answered: int
    refused: int  # requests answered 503 because no instance could run them


class InstancePool:
    """Pinned model instances answering requests as fast as the plan allows.

    Use as a context manager, or call close(). submit() and infer() are safe from any thread.
    """

    def __init__(self, model: ModelConfig, instances: Sequence[InstanceConfig], codec: CodecConfig | None = None,
                 start_timeout: float = 600.0, unavailable_after_s: float = 30.0, gather_ms: float = GATHER_MS):
        if not instances:
            raise ValueError("a pool needs at least one instance")
        self._check_cores(instances)
        if codec is None:
            from .models import resolve

            codec = CodecConfig.for_model(resolve(model.model, model.input_shape))
        self.model, self.codec = model, codec
        self.start_timeout, self.unavailable_after_s = start_timeout, unavailable_after_s
        self.gather_s = gather_ms / 1e3
        self.respawns = 0
        self.mode = ""
        self.last_compute_ms = 0.0  # model + codec time of the last answered sub-batch
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._queue: deque[_Job] = deque()
        self._instances: list[_Instance] = []
        self._parked: list[_Instance] = []  # retired by the last switch; reused if the plan comes back
        self._respawn_failures, self._respawning, self._answered, self._refused = 0, 0, 0, 0
        self._outage: str | None = None  # why the last respawn failed, while no instance is ready
        self._down_since: float | None = None  # when the last ready instance went away
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        try:
            self._instances = [self._spawn(config, i) for i, config in enumerate(instances)]
            self.mode = [inst.wait_ready(start_timeout) for inst in self._instances][0]
        except BaseException:
            self.close()
            raise
        self._dispatcher = threading.Thread(target=self._dispatch_loop, daemon=True, name="packrat-dispatch")
        self._dispatcher.start()
        log.info("pool ready: %s (%s mode)", self.describe(), self.mode)

    @classmethod
    def from_plan(cls, model: ModelConfig, plan, capacity: int = 0, **kwargs) -> "InstancePool":
        """A pool for a planner.Plan: one instance per planned ⟨threads, batch, cores⟩."""
        return cls(model, configs_for(plan, capacity), **kwargs)

    @staticmethod
    def _check_cores(configs: Sequence[InstanceConfig]) -> None:
        cores = [c for config in configs for c in config.cores]
        if len(cores) != len(set(cores)):
            raise ValueError(f"instances share cores: {[list(c.cores) for c in configs]}")

    @property
    def configs(self) -> list[InstanceConfig]:
        with self._lock:
            return [inst.config for inst in self._instances]

    @property
    def batch(self) -> int:
        return sum(c.batch for c in self.configs)

    @property
    def outstanding(self) -> int:
        """Requests queued or running now."""
        with self._lock:
            return len(self._queue) + sum(len(inst.jobs) for inst in self._instances + self._parked)

    def describe(self) -> str:
        return ", ".join(f"⟨{c.threads} threads, batch {c.batch}, cores {list(c.cores)}⟩" for c in self.configs)

    def pids(self) -> list[int]:
        with self._lock:
            return [inst.process.pid for inst in self._instances]

    def _spawn(self, config: InstanceConfig, index: int, nice: int = 0) -> _Instance:
        return _Instance(index, self.model, config, self.codec, nice)

    # ---- answering requests -------------------------------------------------------------------

    def submit(self, request: Request) -> Future:
        """Queue one request; the future gets its Answer (never an exception)."""
        job = _Job(request, Future())
        with self._lock:
            if self._closed.is_set():
                raise PoolError("pool is closed")
            if len(request.body) > self.codec.max_body_bytes:  # refused before it is copied anywhere
                job.future.set_result(Answer.error(413, f"request too large: {len(request.body)} bytes "
                                                        f"(limit {self.codec.max_body_bytes})"))
                return job.future
            reason = self._unavailable()
            if reason:
                self._refused += 1
                job.future.set_result(Answer.error(503, reason))
                return job.future
            self._queue.append(job)
        self._wake()
        return job.future

    def infer(self, requests: Sequence[Request]) -> list[Answer]:
        """Answers for `requests`, in order (blocks until all are answered)."""
        return [future.result() for future in [self.submit(r) for r in requests]]

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):  # already awake (buffer full) or closing
            pass

    def _dispatch_loop(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                gathering = self._assign()
                watched = {inst.conn: inst for inst in self._instances + self._parked if inst.ready}
            try:
                readable = wait([self._wake_r, *watched], timeout=0.5 if gathering is None else gathering)
            except OSError:  # a connection closed under us: look again
                continue
            for handle in readable:
                if handle is self._wake_r:
                    try:
                        self._wake_r.recv(4096)
                    except OSError:
                        return
                else:
                    self._collect(watched[handle])
            with self._lock:
                self._refuse_if_unavailable()

    def _assign(self) -> float | None:
        """Give queued requests to the idle instances, split by their planned shares. Returns how
        long to look again after, while a gather window is open, else None."""
        idle = [inst for inst in self._instances if inst.idle]
        if not self._queue or not idle:
            return None
        waited = time.monotonic() - self._queue[0].queued_at
        if len(self._queue) < sum(inst.config.batch for inst in idle) and waited < self.gather_s:
            return self.gather_s - waited  # the rest of the wave is probably on its way
        n = min(len(self._queue), sum(inst.config.slots for inst in idle))
        sizes = split_sizes(n, [inst.config.batch for inst in idle], [inst.config.slots for inst in idle])
        for inst, size in zip(idle, sizes):
            if size:
                jobs = [self._queue.popleft() for _ in range(size)]
                try:
                    inst.submit(jobs)
                except OSError:  # its socket is broken: it died; _collect will see EOF
                    inst.jobs = jobs
        return None

    def _collect(self, inst: _Instance) -> None:
        try:
            message = inst.conn.recv()
        except (EOFError, OSError):  # its socket closed: the process is gone
            self._lost(inst)
            return
        _, answers, compute_ms = message
        with self._lock:
            jobs, inst.jobs = inst.jobs, []
            self._answered += len(jobs)
            self.last_compute_ms = compute_ms
        for job, (status, body, reason) in zip(jobs, answers):
            _resolve(job, Answer(status, body, reason))

    def _lost(self, dead: _Instance) -> None:
        """A dead instance: its requests back to the queue's front, a respawn in the background
        (unless a switch had already retired it)."""
        with self._lock:
            dead.ready = False
            self._requeue(dead)
            if dead in self._parked:
                self._parked.remove(dead)
                dead.close(timeout=0)
                return
            if dead not in self._instances:
                return
            log.warning("instance %d (cores %s) died with exit code %s; respawning",
                        dead.index, list(dead.config.cores), dead.process.poll())
            self.respawns += 1
            self._respawning += 1
            if not any(inst.ready for inst in self._instances):
                self._down_since = time.monotonic()
        dead.close(timeout=0)
        threading.Thread(target=self._respawn, args=(dead,), daemon=True, name="packrat-respawn").start()

    def _requeue(self, inst: _Instance) -> None:
        """The instance's requests back to the front of the queue, in order (caller holds the lock);
        a request that has been on MAX_ATTEMPTS lost instances is answered 500 instead."""
        jobs, inst.jobs = inst.jobs, []
        for job in reversed(jobs):
            job.attempts += 1
            if job.attempts >= MAX_ATTEMPTS:
                _resolve(job, Answer.error(500, f"{MAX_ATTEMPTS} model instances died while running this request"))
            else:
                self._queue.appendleft(job)

    def _respawn(self, dead: _Instance) -> None:
        """Start a replacement until one comes up (back-off between attempts) or the pool moves on."""
        delay, attempt, current = BACKOFF_S[0], 0, dead
        while True:
            with self._lock:
                if self._closed.is_set() or current not in self._instances:  # closed, or retired by a switch
                    self._respawning -= 1
                    return
                attempt += 1
                fresh = self._spawn(dead.config, dead.index)
                self._instances[self._instances.index(current)] = current = fresh
            try:
                fresh.wait_ready(self.start_timeout)
            except (PoolError, OSError) as exc:
                fresh.close(timeout=0)
                with self._lock:
                    if self._closed.is_set() or fresh not in self._instances:
                        continue  # stopped on purpose: not a failure
                    self._respawn_failures += 1
                    self._outage = f"respawning instance {dead.index} failed: {exc}"
                log.error("respawning instance %d failed (attempt %d): %s; retrying in %.0f s",
                          dead.index, attempt, exc, delay)
                self._wake()  # queued requests may now have to be refused
                self._closed.wait(delay)
                delay = min(delay * 2, BACKOFF_S[1])
                continue
            with self._lock:
                self._respawning -= 1
                self._down_since = self._outage = None
            log.info("instance %d respawned (attempt %d)", dead.index, attempt)
            self._wake()
            return

    def _unavailable(self) -> str | None:
        """Why no request can be run now, or None (caller holds the lock)."""
        if any(inst.ready for inst in self._instances):
            return None
        if self._outage:
            return f"no model instance is running ({self._outage}); retrying in the background"
        if self._down_since is not None and time.monotonic() - self._down_since > self.unavailable_after_s:
            return f"no model instance has been running for {self.unavailable_after_s:.0f} s; restarting"
        return None

    def _refuse_if_unavailable(self) -> None:
        reason = self._unavailable()
        if reason and self._queue:
            log.error("refusing %d queued request(s): %s", len(self._queue), reason)
            while self._queue:
                self._refused += 1
                _resolve(self._queue.popleft(), Answer.error(503, reason))

    def health(self) -> Health:
        with self._lock:
            return Health(len(self._instances), sum(inst.ready for inst in self._instances), self._respawning,
                          self._respawn_failures, self._unavailable(), len(self._queue), self._answered,
                          self._refused)

    # ---- reconfiguration ------------------------------------------------------------------------

    def reconfigure(self, configs: Sequence[InstanceConfig], warmup_nice: int = 10) -> dict[str, int]:
        """Switch to new instances without stopping service.

        Instances whose threads and cores stay (and that can take the new share) are kept and
        only get their new share; so are instances parked by the previous switch, which makes
        switching back and forth between two plans instant. The others are started beside the
        live ones at low priority, warmed up, and swapped in: from then on only they get new
        requests, while retired instances finish the requests they hold and are parked (idle,
        blocked on their socket: memory but no CPU) until the next switch that retires others.
        Thread counts of live instances never change. If a new instance fails to start, the pool
        is left as it was and PoolError raised.
        """
        self._check_cores(configs)
        with self._lock:
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
        with self._lock:
            retired = [inst for inst in self._instances if id(inst) not in reused]
            still_parked = [inst for inst in self._parked if id(inst) not in reused]
            for position, inst in kept.items():
                inst.config = configs[position]
                inst.index = position
            self._instances = [kept.get(p) or fresh[p] for p in range(len(configs))]
            self._down_since = self._outage = None
            if retired:  # park this switch's leftovers; the older parked ones go
                self._parked, stopped = [i for i in retired if i.ready], still_parked + [i for i in retired
                                                                                          if not i.ready]
            else:
                self._parked, stopped = still_parked, []
            for inst in stopped:  # still busy with an earlier switch's requests: they run again elsewhere
                self._requeue(inst)
        self._wake()
        for inst in stopped:
            inst.close()
        counts = {"kept": len(kept), "started": len(fresh), "parked": len(retired), "stopped": len(stopped)}
        log.info("pool reconfigured: %s (%s)", self.describe(), ", ".join(f"{v} {k}" for k, v in counts.items()))
        return counts

    @staticmethod
    def _match(configs: Sequence[InstanceConfig], candidates: list[_Instance]) -> dict[int, _Instance]:
        """Position in `configs` -> a ready instance with the same threads and cores."""
        kept: dict[int, _Instance] = {}
        for position, config in enumerate(configs):
            match = next((inst for inst in candidates if inst.ready and inst.alive and inst not in kept.values()
                          and (inst.config.threads, inst.config.cores) == (config.threads, config.cores)), None)
            if match is not None:
                kept[position] = match
        return kept

    # ---- shutdown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every instance process and free the shared memory; idempotent. Requests still
        queued are answered 503."""
        self._closed.set()
        self._wake()
        dispatcher = getattr(self, "_dispatcher", None)
        if dispatcher is not None and dispatcher is not threading.current_thread():
            dispatcher.join(5)
        with self._lock:
            instances, self._instances, self._parked = self._instances + self._parked, [], []
            jobs = list(self._queue) + [job for inst in instances for job in inst.jobs]
            self._queue.clear()
        for job in jobs:
            _resolve(job, Answer.error(503, "the model is being unloaded"))
        for inst in instances:
            inst.close()
        for sock in (self._wake_r, self._wake_w):
            sock.close()

    def __enter__(self) -> "InstancePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":  # an instance process: python -m packrat.pool FD
    _instance_main(Connection(int(sys.argv[1])))
