"""The handle on a thread instance: a runtime's session in a thread of the serving process, pinned
to the instance's cores, beside (or instead of) the instance processes (instance.py).

The kind of runtime that allows it (models.runtimes.THREAD_KINDS: ONNX Runtime, whose run releases
the GIL and whose intra-op pool is the session's own) needs no hand-off between processes: the
thread submitting a sub-batch hands it to the instance's thread, one wake; that thread copies each
raw tensor body into its row of the instance's batch (the "copy" stage; a large body with the GIL
released, so the other instances' threads start meanwhile), decodes the other bodies into their
rows, runs the session and encodes the answers on the instance's cores, and resolves the requests'
futures itself (`done` below: the pool's bookkeeping, and the next queued requests handed out,
without a wake of the dispatch thread).

The handle has the process handle's interface (ready, jobs, busy_since, waiting_turn, sent_stamps,
hung, submit, kill, stop, close, ...), so the dispatcher and the supervisor treat both alike;
`kind` tells them apart where they must differ: a stuck thread cannot be killed, only cancelled
(`kill` ends the session's run under way), and its stamps come without a socket in between. A
thread that does not return from a cancelled run (stuck in Python, a decoder, a lock), or from its
load within the start timeout, is abandoned by the supervisor, its cores fenced off until it
returns (supervisor.py).

Its threads: the instance's thread is pinned to all its cores while it starts the image decoders
(which inherit that) and loads the session (whose intra-op threads are pinned one to each core but
the first), then to its first core, where it computes its share of each run. It carries a name of
its own in the kernel (packrat-tN), which every thread it starts inherits: its threads are those
of that name, found without holding up any other instance's start (`thread_ids`), and their CPU
time is theirs, not the process's (warm_up's clock; bench.resources.server_cpu).

It changes nothing process-wide: `pid` is the serving process's (which it shares with the engine
and every other thread instance), `tid` its own thread's; its own thread and its decoders each run
torch with one intra-op thread, set for them alone (codec.batch.own_intra_op_threads), whatever the
process's count (the engine's, engine.serving_torch_threads, or a benchmark's).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

import numpy

from packrat.codec.config import CodecConfig
from packrat.codec.rows import RowsLayout
from packrat.machine.threads import PinnedWorker, pin_thread, task_affinities, thread_cpu_s
from packrat.serving.pool.api import InstanceConfig, ModelConfig
from packrat.serving.pool.child import Batch, run_in_turns
from packrat.serving.pool.instance import StartFailed
from packrat.serving.pool.turns import Turn, turn_sizes

log = logging.getLogger("packrat.serving.pool")

# done(instance, jobs, (replies, instance stamps, turns) or None, why it failed or None): the pool's
Done = Callable[["ThreadInstance", list, tuple | None, str | None], None]
BYTES = (bytes, bytearray, memoryview)
THREAD_NAME = "packrat-t"  # the kernel's name of a thread instance's threads: this, then a number unique in the process
_numbers = itertools.count()
# A body up to this size is copied holding the GIL (cheaper than numpy's call); a larger one lets it
# go, so that another instance's thread need not wait for the whole copy to start
HELD_COPY_BYTES = 64 << 10


def own_threads(tasks: dict[int, tuple[str, set[int]]], name: str) -> set[int]:
    """The ids of the threads named `name` among `tasks` (task_affinities()): an instance's own."""
    return {tid for tid, (task_name, _) in tasks.items() if task_name == name}


class ThreadInstance:
    """One thread instance: its pinned thread, its session, its batch's rows, and the jobs it runs."""

    kind = "thread"
    conn = None  # nothing to watch: it reports through `done`

    def __init__(self, index: int, model: ModelConfig, config: InstanceConfig, codec: CodecConfig, done: Done,
                 nice: int = 0, locks: str | None = None):
        self.index, self.config, self._done = index, config, done
        self.layout = RowsLayout.of(codec, config.slots)
        self.ready = False
        self.mode = ""
        self.fallback: str | None = None
        self.warm_ms = 0.0
        self.jobs: list = []
        self.busy_since = 0.0
        self.waiting_turn = False
        self.sent_stamps: tuple[float, ...] = ()
        self.hung = False  # cancelled by the watchdog
        self.abandoned = False  # stuck in that run past its allowance: its cores fenced off (supervisor.py)
        self.locks = locks
        self.turn_ms: float | None = None
        self.sent_locked = False
        self.slot = None
        self.thread_ids: set[int] = set()  # the kernel's ids of its threads (its own, decoders', session's)
        self._stopping = False
        self._buffer = bytearray(self.layout.size)
        self._view = memoryview(self._buffer)
        self._rows = numpy.frombuffer(self._buffer, numpy.uint8)  # the same bytes, for numpy's copies
        self._served = None  # what the thread serves with, once loaded (_Loaded)
        self.name = f"{THREAD_NAME}{next(_numbers)}"
        self.worker = PinnedWorker(config.cores, f"packrat-instance-{index}", self.name)
        self._loading = self.worker.call(lambda: self._load(model, codec, nice))

    # ---- on the instance's thread ----------------------------------------------------------------

    def _load(self, model: ModelConfig, codec_config: CodecConfig, nice: int) -> None:
        import torch

        from packrat.codec.batch import Decoders, own_intra_op_threads
        from packrat.codec.codec import Codec
        from packrat.codec.rows import InputRows
        from packrat.models.runtimes import ensure_artefact
        from packrat.models.zoo import resolve
        from packrat.serving.pool.child import load_runtime, warm_up  # looked up here: tests stand in for them
        from packrat.serving.pool.core_locks import holding

        if nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)  # this thread alone; the threads it starts inherit it
        # Issue 70's 7.3 ms encode at B = 8: torch split the softmax over the process's 2 threads, its
        # OpenMP worker on this thread's one core, where it ran only once this thread's barrier spin gave up
        own_intra_op_threads(1)
        codec = Codec(codec_config)
        spec = resolve(model.model, model.input_shape)
        ensure_artefact(spec, self.config.runtime, model.compile_cache)
        decoders = Decoders(self.config.threads if codec.input_kind == "image" else 1, process_wide=False)
        module, examples, mode = load_runtime(spec, model, self.config, self.config.runtime, decoders.parallel)
        self.thread_ids = own_threads(task_affinities(), self.name) | {threading.get_native_id()}
        pin_thread(self.config.cores[:1])  # the session's threads have the other cores, one each
        with torch.inference_mode():
            self.warm_ms = warm_up(module, examples, self.config.threads,
                                   lambda: holding(self.locks, self.config.cores),
                                   cpu_clock=lambda: thread_cpu_s(self.thread_ids))
        self.mode = mode
        self._served = (module, codec, decoders, InputRows(codec_config, self.layout, self._view), Turn(self.config.cores))

    def _serve(self, jobs: list, bodies: list, stamps: tuple, locks: str | None, turn_ms: float | None) -> None:
        woken = time.monotonic()
        in_rows = self._copy_raw(bodies)
        copy_s = time.monotonic() - woken
        # Each stage keeps its length and its place: the copy, done after the wake, is counted before
        # it; nothing is sent (the wake counts from the dispatch)
        queued, dispatched = stamps
        self.sent_stamps = (queued, dispatched, dispatched + copy_s, dispatched + copy_s)
        received = woken + copy_s
        module, codec, decoders, rows, turn = self._served
        turn.quantum = turn_ms if locks is not None else None
        sizes = turn_sizes(len(bodies), self.warm_ms / self.config.batch, turn.quantum)
        try:
            replies, stamps = run_in_turns(self._said, module, codec, decoders, turn, locks,
                                           Batch(bodies, rows, in_rows), sizes, received)
        except Exception as exc:  # cancelled by the watchdog, or a failure of ours: the pool decides
            turn.end()
            self._done(self, jobs, None, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")
            return
        self._done(self, jobs, (replies, stamps, len(sizes)), None)

    def _copy_raw(self, bodies: list) -> frozenset:
        """Each raw tensor body of one sample copied into its row, where it is read as it lies (a
        large one by numpy, with the GIL released: the other instances' threads go on); the indices
        copied."""
        layout, rows = self.layout, self._rows
        in_rows = []
        for index, (body, content_type, header_length) in enumerate(bodies):
            if index < layout.slots and isinstance(body, BYTES) and len(body) == layout.row_bytes:
                offset = layout.row_offset(index)
                if len(body) <= HELD_COPY_BYTES and not isinstance(body, memoryview):
                    self._view[offset:offset + len(body)] = body
                else:
                    numpy.copyto(rows[offset:offset + len(body)], numpy.frombuffer(body, numpy.uint8))
                bodies[index] = (self._view[offset:offset + len(body)], content_type, header_length)
                in_rows.append(index)
        return frozenset(in_rows)

    def _said(self, message: tuple) -> None:
        """What run_in_turns tells the process handle over its socket (receive() there)."""
        if message[0] == "locked":
            self.busy_since = message[1]
        self.waiting_turn = message[0] == "waiting"

    # ---- from the pool's threads -----------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The serving process's: shared with the engine and every other thread instance, not its own."""
        return os.getpid()

    @property
    def tid(self) -> int | None:
        """The kernel's id of its own thread."""
        return self.worker.native_id

    def wait_ready(self, timeout: float) -> str:
        try:
            self._loading.result(timeout)
        except FutureTimeout:
            raise StartFailed(f"instance {self.index} did not start within {timeout:.0f} s") from None
        except Exception as exc:
            raise StartFailed(f"instance {self.index} failed to start: {type(exc).__name__}: "
                              f"{(str(exc).splitlines() or [''])[0][:300]}") from None
        self.ready = True
        return self.mode

    def restore_priority(self) -> bool:
        try:
            for tid in self.thread_ids:
                os.setpriority(os.PRIO_PROCESS, tid, 0)
            return True
        except (PermissionError, ProcessLookupError):
            return False

    def submit(self, jobs: list) -> None:
        """The sub-batch handed to the instance's thread: one wake. That thread copies the raw
        tensor bodies into their rows (the copy stage) and decodes the others."""
        dispatched = time.monotonic()
        self.jobs, self.busy_since, self.sent_locked = jobs, dispatched, self.locks is not None
        self.waiting_turn = self.sent_locked
        bodies = [(job.request.body, job.request.content_type, job.request.header_length) for job in jobs]
        stamps = (min(job.queued_at for job in jobs), dispatched)
        self.worker.post(lambda: self._serve(jobs, bodies, stamps, self.locks, self.turn_ms))

    @property
    def working(self) -> int:
        return 0 if self.waiting_turn else len(self.jobs)

    @property
    def alive(self) -> bool:
        return self.worker.alive and not self.hung

    @property
    def idle(self) -> bool:
        return self.ready and not self.jobs

    @property
    def stuck(self) -> bool:
        """Its thread has not returned from a cancelled run."""
        return self.hung and self.worker.alive

    @property
    def loading(self) -> bool:
        """Its load has not returned (nor raised): its thread is still in it."""
        return not self._loading.done()

    def kill(self) -> None:
        """Cancel the session's run under way (the watchdog's; a thread cannot be killed). The thread
        ends once the run returns."""
        if self._served is not None and hasattr(self._served[0], "cancel"):
            self._served[0].cancel()
        self.stop()

    def stop(self) -> None:
        if self._stopping:
            return
        self._stopping, self.ready = True, False
        self.worker.stop()

    def close(self, timeout: float = 5.0) -> None:
        """Stop it and wait up to `timeout` for its thread to end; a thread that does not (stuck in a
        run) is left behind, holding its memory and cores until it returns or the process ends. One
        the supervisor abandoned is not waited for again."""
        self.stop()
        if self.abandoned:
            return
        self.worker.thread.join(timeout)
        if self.worker.alive and timeout > 0:
            log.error("instance %d's thread (cores %s) did not end within %.0f s; left behind",
                      self.index, list(self.config.cores), timeout)
