"""The instance pool: one pinned process per planned instance, fed request bytes through shared memory.

``InstancePool`` is the one thing the handler, the controller and the benchmarks use. It composes:
- ``child`` — the instance process (``python -m packrat.serving.pool FD``): pinned to its cores, with its
  thread counts; decodes, runs and encodes its requests;
- ``instance`` — the parent's handle on one such process and the shared-memory transport;
- ``dispatch`` — the queue, each instance's share, the gather window, deadlines, re-queueing (pure);
- ``supervisor`` — lifecycles: start, death, respawn with back-off, the hung-instance watchdog,
  availability, and reconfiguration;
- ``stages`` — where each sub-batch's time goes, from the stamps the parent and the instance take.

One dispatch thread runs the loop: hand queued requests to idle instances, wait on every busy
instance's socket, collect answers, notice deaths (a socket that closes), kill instances whose
batch ran past the watchdog's allowance, and answer requests past their deadline. Every answered
sub-batch's stages (queue, copy, send, wake, locks, decode, model, encode, reply, hand-out) are
kept for health(), so `packrat status` shows where the time goes.

Requests come from the TorchServe handler (handlers/packrat_handler.py): a whole batch at a time in
TorchServe's ordinary worker mode (submitted inside together(), so it reaches the instances whole);
from the Ray Serve front end one by one as they arrive, gathered for up to gather_ms. A second TorchServe worker sharing these
instances was not built: workers are separate processes, so the queue and the instances would have
to move into a third process, adding a hop per request.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from multiprocessing.connection import wait
from typing import Iterator, Sequence

from packrat.codec.config import CodecConfig
from packrat.codec.rows import RowsLayout
from packrat.errors import PoolError
from packrat.serving.pool.api import (
    Answer,
    Health,
    InstanceConfig,
    ModelConfig,
    Request,
    configs_for,
)
from packrat.serving.pool.admission import CAUSES, Outlook, ServedRounds, answer_in_s
from packrat.serving.pool.child import exit_with_parent
from packrat.serving.pool.dispatch import Dispatcher, split_sizes
from packrat.serving.pool.instance import Instance, sweep_stale_segments
from packrat.serving.pool.stages import StageTimes
from packrat.serving.pool.supervisor import Supervisor, Watchdog
from packrat.serving.payloads import BodyCounts, one_row
from packrat.serving.served import MIN_SAMPLES, ServedLatencies, served_key
from packrat.settings import GATHER_MS, MAX_QUEUE, REQUEST_TIMEOUT_S

__all__ = ["Answer", "Health", "InstanceConfig", "InstancePool", "ModelConfig", "PoolError", "Request",
           "Watchdog", "configs_for", "exit_with_parent", "split_sizes"]

log = logging.getLogger("packrat.serving.pool")

SETTLE_S = 2.0  # after a reconfiguration or a lost instance, model times are left out this long (served.py)
LOOK_EVERY_S = 0.2  # the dispatch loop's longest sleep: watchdog and deadlines are checked this often


def _answered(answer: Answer) -> Future:
    future = Future()
    future.set_result(answer)
    return future


class InstancePool:
    """Pinned model instances answering requests as fast as the plan allows.

    Use as a context manager, or call close(). submit() and infer() are safe from any thread.
    """

    def __init__(self, model: ModelConfig, instances: Sequence[InstanceConfig], codec: CodecConfig | None = None,
                 start_timeout: float = 600.0, gather_ms: float = GATHER_MS,
                 request_timeout_s: float = REQUEST_TIMEOUT_S, max_queue: int = MAX_QUEUE,
                 admission: str = "predicted", watchdog: Watchdog = Watchdog(), on_fence=None):
        if not instances:
            raise ValueError("a pool needs at least one instance")
        check_cores(instances)
        if codec is None:
            from packrat.models.zoo import resolve

            codec = CodecConfig.for_model(resolve(model.model, model.input_shape))
        self.model, self.codec = model, codec
        self.mode = ""
        # bodies served, raw (straight into a row: Instance.submit) or decoded: the engine plans on
        # the figures of the payload it is served (payloads.py)
        self.bodies = BodyCounts()
        self._row_bytes = RowsLayout.of(codec, 1).row_bytes
        self.served = ServedLatencies()  # model-stage times per ⟨threads, batch, runtime⟩ (served.py)
        self.last_compute_ms = 0.0  # the last answered sub-batch's time in its instance (locks, codec, model)
        self.stages = StageTimes()  # where the recent sub-batches' time went (stages.py)
        self.rounds = ServedRounds()  # a planned batch's time as served, for admission (admission.py)
        self._lock = threading.RLock()
        self._held = 0  # blocks of together() under way: dispatch waits for them
        self._closed = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self.dispatcher = Dispatcher(gather_ms, request_timeout_s, max_queue, admission=admission)
        self.supervisor = Supervisor(model, codec, self._lock, self._closed, self._requeue, self._wake,
                                     start_timeout=start_timeout, watchdog=watchdog, thread_done=self._thread_done,
                                     on_fence=on_fence)  # on_fence(cores): abandoned threads' cores changed
        swept = sweep_stale_segments()
        if swept:
            log.warning("removed %d shared-memory segment(s) left by a dead process: %s", len(swept), swept)
        try:
            self.mode = self.supervisor.start(instances)
        except BaseException:
            self.close()
            raise
        self._dispatch_thread = threading.Thread(target=self._dispatch_loop, daemon=True, name="packrat-dispatch")
        self._dispatch_thread.start()
        log.info("pool ready: %s (%s mode)", self.describe(), self.mode)

    @classmethod
    def from_plan(cls, model: ModelConfig, plan, capacity: int = 0, fallbacks=None, **kwargs) -> "InstancePool":
        """A pool for a planner.Plan: one instance per planned ⟨threads, batch, cores⟩ (api.configs_for)."""
        return cls(model, configs_for(plan, capacity, fallbacks), **kwargs)

    @property
    def configs(self) -> list[InstanceConfig]:
        with self._lock:
            return [inst.config for inst in self.supervisor.instances]

    @property
    def batch(self) -> int:
        return sum(c.batch for c in self.configs)

    @property
    def respawns(self) -> int:
        return self.supervisor.respawns

    @property
    def working(self) -> int:
        """Requests running on cores their instance holds: the pool's work, without the queue and
        without batches waiting for another model's turn."""
        with self._lock:
            return sum(inst.working for inst in self._everyone())

    @property
    def outstanding(self) -> int:
        """Requests queued or running now."""
        with self._lock:
            return len(self.dispatcher.queue) + sum(len(inst.jobs) for inst in self._everyone())

    def _everyone(self) -> list[Instance]:
        return self.supervisor.instances + self.supervisor.parked

    def describe(self) -> str:
        with self._lock:
            instances = list(self.supervisor.instances)
        return ", ".join(f"⟨{i.config.threads} threads, batch {i.config.batch}, cores {list(i.config.cores)}"
                         f"{'' if i.config.runtime == 'inductor' else ', ' + i.config.runtime}, {i.kind}⟩"
                         for i in instances)

    def pids(self) -> list[int]:
        """Each instance's process (a thread instance's is the serving process)."""
        with self._lock:
            return [inst.pid for inst in self.supervisor.instances]

    def fenced_cores(self) -> frozenset:
        """The cores abandoned thread instances hold: no plan may use them (supervisor.py)."""
        return self.supervisor.fenced_cores()

    # ---- answering requests -------------------------------------------------------------------

    def submit(self, request: Request) -> Future:
        """Queue one request; the future gets its Answer (never an exception)."""
        with self._lock:
            future = self._enqueue(request, *self._ahead())
            if future.done() or self._held:  # refused; or inside together(), whose end hands it out
                return future
        # The dispatch thread hands it out. Handing it out here instead (in a front end's event loop)
        # served SqueezeNet behind the KServe server 1.25-1.32x slower than a plain server at 4 users
        # against 1.13x, and gained nothing at 1 (docs/benchmarks/peers.md, issue 63)
        self._wake()
        return future

    def submit_all(self, requests: Sequence[Request]) -> list[Future]:
        """Queue `requests` as one batch, handed out together (as in together()); the pool is looked
        at once for all of them: a look per request was a third of submit's time (issue 70)."""
        with self.together():
            with self._lock:
                ahead = self._ahead()
                return [self._enqueue(request, *ahead) for request in requests]

    def _ahead(self) -> tuple[str | None, Outlook]:
        """What requests arriving now find (caller holds the lock): why no instance can run them,
        if none can, and the queue's outlook. A request queued after it sees the same, with itself
        ahead: the outlook's idle pool counts only for a request that finds the queue empty."""
        if self._closed.is_set():
            raise PoolError("pool is closed")
        reason = self.supervisor.unavailable()
        return reason, (Outlook() if reason else self._outlook())

    def _enqueue(self, request: Request, unavailable: str | None, outlook: Outlook) -> Future:
        """One request queued, or answered at once where it is refused (caller holds the lock)."""
        if len(request.body) > self.codec.max_body_bytes:  # refused before it is copied anywhere
            return _answered(Answer.error(413, f"request too large: {len(request.body)} bytes "
                                               f"(limit {self.codec.max_body_bytes})"))
        if unavailable:
            return _answered(self.dispatcher.unavailable(unavailable))
        job = self.dispatcher.enqueue(request, outlook)
        if not job.future.done():  # a refused one costs no instance anything
            if one_row(len(request.body), request.header_length, self._row_bytes):
                self.bodies.raw += 1
            else:
                self.bodies.decoded += 1
        return job.future

    def refusal(self, received_at: float | None = None, timeout_s: float | None = None) -> Answer | None:
        """How a request arriving now would be refused (counted as refused), or None if it would be
        admitted: for a front end to ask before it reads and decodes the body. `received_at`: when
        the front end received it (time.monotonic()); `timeout_s`: the client's deadline, if known."""
        with self._lock:
            if self._closed.is_set():
                return None  # submit() says so
            return self.dispatcher.refusal(self._outlook(), received_at, timeout_s)

    def _outlook(self) -> Outlook:
        """The queue's view ahead of a request arriving now (caller holds the lock)."""
        idle = not self.dispatcher.queue and not any(inst.jobs for inst in self._everyone())
        return self.rounds.outlook(time.monotonic(), [(_expected_s(inst.config), inst.config.batch,
                                                       inst.busy_since if inst.jobs else None)
                                                      for inst in self.supervisor.instances if inst.ready], idle)

    def infer(self, requests: Sequence[Request]) -> list[Answer]:
        """Answers for `requests`, in order, run as one batch (blocks until all are answered)."""
        return [future.result() for future in self.submit_all(requests)]

    @contextmanager
    def together(self) -> Iterator[None]:
        """Requests submitted in this block are dispatched together, once it ends. For a front end
        holding a whole batch (TorchServe's ordinary worker, whose pool starts idle instances at
        once: gather_ms 0): submitted one by one, the first ones would otherwise go out alone
        whenever the dispatch thread got the GIL between two submits, and the rest wait for them
        (measured: 43 sub-batches for 40 batches of 4; ResNet-50 at B = 4 through a fat pool took
        1.23-1.29x the in-process time, 1.02x with this). The block's end hands them to idle
        instances itself, so the dispatch thread's wake-up is not on their way; it is not woken at
        all unless requests are left in the queue (it watches every ready instance already): each
        wake-up is a thread taking a core from the instances while their batch runs."""
        with self._lock:
            self._held += 1
        try:
            yield
        finally:
            with self._lock:
                self._held -= 1
                if not self._held and not self._closed.is_set():
                    self.dispatcher.assign(self.supervisor.instances)
                left = bool(self.dispatcher.queue)
            if left:  # requests no idle instance took: the loop's to hand out (gather windows, deadlines)
                self._wake()

    def _requeue(self, jobs: list, why: str) -> None:
        """A lost or retired instance's requests (caller holds the lock): queued again, or, once the
        pool is closed, answered 503 (its queue was answered and nothing hands it out any more: a
        switch that ended after an unload had put them back unanswered)."""
        if self._closed.is_set():
            for job in jobs:
                self.dispatcher.refuse(job, "the model is being unloaded")
        else:
            self.dispatcher.requeue(jobs, why)

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):  # already awake (buffer full) or closing
            pass

    def _dispatch_loop(self) -> None:
        while not self._closed.is_set():
            with self._lock:
                timeout = self._look()
                watched = {inst.conn: inst for inst in self.supervisor.serving() if inst.conn is not None}
            try:
                readable = wait([self._wake_r, *watched], timeout=timeout)
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

    def _look(self) -> float:
        """One round of the loop's bookkeeping (caller holds the lock); how long to sleep after."""
        gathering = None if self._held else self.dispatcher.assign(self.supervisor.instances)
        self.supervisor.kill_overdue(time.monotonic())
        next_deadline = self.dispatcher.expire(job for inst in self._everyone() for job in inst.jobs)
        reason = self.supervisor.unavailable()
        if reason and self.dispatcher.queue:
            log.error("refusing %d queued request(s): %s", self.dispatcher.refuse_queued(reason), reason)
        return max(0.0, min(t for t in (LOOK_EVERY_S, gathering, next_deadline) if t is not None))

    def _collect(self, inst: Instance) -> None:
        try:  # in the loop's thread, as the watchdog: it reads a turn's start between two of these
            received = inst.receive()
        except (EOFError, OSError):  # its socket closed: the process is gone
            with self._lock:
                self.served.settle(time.monotonic() + SETTLE_S)
                self.rounds.settle(time.monotonic() + SETTLE_S)
                self.supervisor.lost(inst)
            return
        if received is None:  # only its turn began
            return
        replies, instance_stamps, turns = received
        received = time.monotonic()
        with self._lock:
            jobs, inst.jobs = inst.jobs, []
            self._answered(inst, jobs, replies, instance_stamps, turns, received)

    def _thread_done(self, inst, jobs: list, result: tuple | None, failure: str | None) -> None:
        """A thread instance's sub-batch, from its own thread: answered (the pool's bookkeeping, then
        the queue's next requests handed out from here, so the dispatch thread is not woken), or
        failed. A run the watchdog cancelled (or a reconfiguration took back) has its requests
        elsewhere already; any other failure loses the instance, as a process's death does."""
        received = time.monotonic()
        gathering = None
        with self._lock:
            if inst.jobs is not jobs:
                return
            if result is None:
                if not inst.hung:
                    log.error("instance %d failed: %s", inst.index, failure)
                    self.served.settle(received + SETTLE_S)
                    self.rounds.settle(received + SETTLE_S)
                    inst.hung = True  # it is not to run again; its thread ends
                    inst.stop()
                    self.supervisor.lost(inst)
                return
            inst.jobs = []
            self._answered(inst, jobs, *result, received)
            if not self._held and not self._closed.is_set():
                gathering = self.dispatcher.assign(self.supervisor.instances)
        if gathering is not None:  # a gather window opened: the dispatch loop keeps its time
            self._wake()

    def _answered(self, inst, jobs: list, replies: list, instance_stamps, turns: int, received: float) -> None:
        """A sub-batch's answers handed out and its stages and served time kept (caller holds the lock)."""
        self.dispatcher.answered(jobs, [Answer(*reply) for reply in replies])
        if jobs:  # none: a reconfiguration took them back while they ran (they run again elsewhere)
            self.rounds.add(received - inst.sent_stamps[1], len(jobs), inst.config.batch, _expected_s(inst.config),
                            received)
            handed_out = time.monotonic()
            self.stages.add((*inst.sent_stamps, *instance_stamps, received, handed_out), len(jobs))
            if turns == 1:  # a batch run in several turns is not the profile's point
                key = served_key(inst.config.threads, inst.config.batch, inst.mode)
                self.served.add(key, (instance_stamps[3] - instance_stamps[2]) * 1e3, len(jobs), received,
                                (handed_out - inst.sent_stamps[1]) * 1e3)
        self.last_compute_ms = (instance_stamps[-1] - instance_stamps[0]) * 1e3

    def stage_sums(self, stages) -> list[float]:
        """Each recent sub-batch's ms in `stages` (stages.STAGES) together, oldest first."""
        with self._lock:
            return self.stages.sums(stages)

    def take_bodies(self) -> tuple[int, int]:
        """(raw, decoded) bodies submitted since the last call."""
        with self._lock:
            return self.bodies.take()

    def served_figures(self, min_samples: int = MIN_SAMPLES, rounds: bool = False) -> dict:
        """Each served ⟨threads, batch, runtime⟩ with `min_samples` at least: (median ms, its error,
        samples) of its model stage, or (`rounds`) from dispatch to hand-out (served.py)."""
        with self._lock:
            return self.served.figures(min_samples, rounds)

    def health(self) -> Health:
        with self._lock:
            s, counts = self.supervisor, self.dispatcher.counts
            return Health(len(s.instances), sum(inst.ready for inst in s.instances), s.respawning,
                          s.respawn_failures, s.unavailable(), len(self.dispatcher.queue), counts.answered,
                          counts.refused, s.watchdog_kills, counts.expired, counts.requeued,
                          stage_ms=self.stages.means(), sub_batches=self.stages.sub_batches,
                          requests_per_sub_batch=self.stages.requests_per_sub_batch(),
                          fallbacks=[f"instance {i.index} {i.fallback}" for i in s.instances if i.fallback],
                          kinds=[{"index": i.index, "kind": i.kind, "runtime": i.config.runtime,
                                  "cores": list(i.config.cores), "pid": i.pid,
                                  **({"tid": i.tid} if i.kind == "thread" else {})} for i in s.instances],
                          abandoned=s.abandoned, fenced=sorted(s.fenced_cores()), admitted=counts.admitted, refused_late=counts.refused_late,
                          predicted_wait_ms=self._predicted_wait_ms(), served_ratio=round(self.rounds.ratio, 3),
                          refusals={cause: counts.refusals[cause] for cause in CAUSES})

    def _predicted_wait_ms(self) -> float | None:
        """When a request arriving now would be answered, as predicted (caller holds the lock)."""
        outlook = self._outlook()
        if outlook.round_s is None:
            return None
        return round(answer_in_s(len(self.dispatcher.queue), outlook.busy_left_s, outlook.batch,
                                 outlook.round_s) * 1e3, 1)

    # ---- reconfiguration ------------------------------------------------------------------------

    def take_turns(self, lock_dir: str | None, turn_ms: float | None = None) -> None:
        """From the next batch on, every instance holds its cores' locks in `lock_dir` while it runs
        one (the node gave these cores to several models, in turns), a batch longer than `turn_ms`
        in several turns; None: the cores are this model's alone. No instance is restarted."""
        with self._lock:
            self.supervisor.core_locks, self.supervisor.turn_ms = lock_dir, turn_ms
            for inst in self._everyone():
                inst.locks, inst.turn_ms = lock_dir, turn_ms

    def runs_unlocked(self) -> bool:
        """Whether a batch sent without the core locks is still running (a change to turns holds
        only once none is)."""
        with self._lock:
            return any(inst.jobs and not inst.sent_locked for inst in self._everyone())

    def reconfigure(self, configs: Sequence[InstanceConfig], warmup_nice: int = 10) -> dict[str, int]:
        """Switch to new instances without stopping service (see Supervisor.reconfigure)."""
        check_cores(configs)
        counts = self.supervisor.reconfigure(configs, warmup_nice)
        with self._lock:
            self.served.settle(time.monotonic() + SETTLE_S)
            self.rounds.settle(time.monotonic() + SETTLE_S)
        log.info("pool reconfigured: %s (%s)", self.describe(), ", ".join(f"{v} {k}" for k, v in counts.items()))
        return counts

    # ---- shutdown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every instance process and free the shared memory; idempotent. Requests still
        queued or running are answered 503."""
        self._closed.set()
        self._wake()
        thread = getattr(self, "_dispatch_thread", None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
        with self._lock:
            queued = list(self.dispatcher.queue)
            self.dispatcher.queue.clear()
        for job in queued + self.supervisor.close():
            self.dispatcher.refuse(job, "the model is being unloaded")
        for sock in (self._wake_r, self._wake_w):
            sock.close()

    def __enter__(self) -> "InstancePool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _expected_s(config: InstanceConfig) -> float | None:
    """An instance's planned latency in seconds (None: its plan has none)."""
    return config.expected_ms / 1e3 if config.expected_ms else None


def check_cores(configs: Sequence[InstanceConfig]) -> None:
    cores = [c for config in configs for c in config.cores]
    if len(cores) != len(set(cores)):
        raise ValueError(f"instances share cores: {[list(c.cores) for c in configs]}")
