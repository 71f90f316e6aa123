"""The instance process: ``python -m packrat.serving.pool FD PARENT_PID``, one per planned instance.

It receives its settings over the socket FD, pins itself to its cores, sets its thread counts,
loads the model and a ``codec.Codec``, warms up, says it is ready (with how long a full planned
batch took: the watchdog's measured yardstick), and then loops: read its requests' bodies from
the input segment the parent wrote (POSIX shared memory the parent creates, grows and unlinks),
answer them with ``codec.batch.answer_batch`` and send the answers back with the stamps of the
batch's stages (stages.py). Decoding and encoding thus run on the instance's cores, in parallel
across instances, and a batch's requests are decoded in parallel on them (Decoders); the parent
only moves bytes. The segment starts with the batch's input rows (codec.rows.InputRows), which
the model reads as they are: a raw tensor body the parent wrote straight into its row is the
model's input without another copy, and an image is decoded into its row. Other bodies are read
as slices of the segment, not copied out of it first.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import select
import threading
import time
from multiprocessing.connection import Connection
from typing import NamedTuple

from packrat.codec.batch import Decoders, answer_batch, set_intra_op_threads
from packrat.models.runtimes import DEFAULT_RUNTIME, torch_threads
from packrat.serving.pool.api import InstanceConfig, ModelConfig
from packrat.serving.pool.core_locks import holding
from packrat.serving.pool.turns import Turn, turn_sizes


def exit_with_parent(cleanup=None, interval_s: float = 0.5, parent: int | None = None,
                     handle: int | None = None) -> None:
    """Exit this process when its parent is gone, after `cleanup()`. Instances use it to go even
    while still loading (they notice the parent's death on their socket only once they serve); the
    handler uses it so that the pool never outlives `torchserve --stop`, whatever keeps the worker
    alive (TorchServe's asynchronous worker, no longer used, kept non-daemon threads blocked forever
    once Java had gone). `parent`: the pid the parent had (an instance is told it): one that died
    before this call is noticed too, where os.getppid() would already name the process that
    adopted this one. `handle`: a pidfd of it already open (a forked instance's, inherited from
    the fork server, its parent, which opened it while the caller was its own).
    (Not PR_SET_PDEATHSIG: it fires when the spawning *thread* ends, and respawns come from
    short-lived threads.)

    The watching thread blocks on a pidfd of the parent, without the GIL, and wakes only when the
    parent exits. It used to poll os.getppid() every `interval_s` (still the way where there is no
    pidfd): a woken Python thread wants the GIL, and an AOTInductor model runs its whole batch
    holding it, so the watcher, once awake mid-batch, retried for the GIL every 5 ms until the batch
    ended, each time taking a core from the model's threads: BERT-base ⟨2, 8⟩ ran 14–16 % over its
    profile point in a pool instance, with 80 such wake-ups a batch (BENCHMARKS.md, issue 32)."""
    parent = os.getppid() if parent is None else parent
    handle = parent_pidfd(parent) if handle is None else handle

    def watch() -> None:
        if handle is not None:
            waiter = select.poll()
            waiter.register(handle, select.POLLIN)
            while not waiter.poll():  # blocks without the GIL; readable once the parent has exited
                pass
        else:
            while os.getppid() == parent:
                time.sleep(interval_s)
        try:
            if cleanup is not None:
                cleanup()
        finally:
            os._exit(0)

    threading.Thread(target=watch, daemon=True, name="packrat-parent-watch").start()


def parent_pidfd(parent: int) -> int | None:
    """A pidfd of `parent` while it is still this process's parent; None where it is gone already
    or pidfds are missing (Linux < 5.3): the watcher then polls os.getppid(), which sees either."""
    try:
        handle = os.pidfd_open(parent)
    except (AttributeError, OSError):  # no pidfds here, or the parent is gone and reaped
        return None
    if os.getppid() == parent:  # opened while it was our parent: the pidfd names it, not a later holder of its pid
        return handle
    os.close(handle)
    return None


def attach(name: str, size: int) -> mmap.mmap:
    """Map a parent-owned segment without registering it with a resource tracker
    (Python < 3.13 would otherwise unlink it when this process exits). Writable: the batch's rows
    are in it, and requests are decoded into them."""
    with open(f"/dev/shm/{name.lstrip('/')}", "r+b") as file:
        return mmap.mmap(file.fileno(), size, access=mmap.ACCESS_WRITE)


def warm_up(module, examples: tuple, threads: int, turn=contextlib.nullcontext, cpu_clock=time.process_time) -> float:
    """Run every batch size the instance will see soon (halving down to 1), so a graph mode's
    compilation or specialisation per shape happens here, not on a live request. Returns the full batch's second run in ms
    as it would take with its `threads` cores to itself: the wall time, or the CPU time per thread
    when that is less. A warm-up beside busy instances (at low priority during a reconfiguration)
    mostly waits for a core, and the watchdog's allowance for this instance rests on this figure.
    Where the cores are time-shared, each timed run takes its turn (`turn()`: the core locks); the
    first run of each shape, which may compile for seconds, runs outside the turns, at the low
    priority of a warm-up beside a live pool, so it does not hold the other models off. `cpu_clock`:
    the CPU seconds of the instance's threads (the process's, for an instance process)."""
    size = full = examples[0].shape[0]
    full_ms = 0.0
    while size >= 1:
        inputs = [example[:size] for example in examples]
        module(*inputs)
        with turn():
            started, cpu_started = time.perf_counter(), cpu_clock()
            module(*inputs)
        if size == full:
            wall_ms = (time.perf_counter() - started) * 1e3
            cpu_ms = (cpu_clock() - cpu_started) * 1e3
            full_ms = min(wall_ms, cpu_ms / threads)
        size //= 2
    return full_ms


def load(model: ModelConfig, config: InstanceConfig, stop_spinning: bool = True):
    """(module, example inputs, mode, why it runs another runtime than planned or None). A runtime
    that fails here (not installed, refused for this model, or failing to load) gives way to the
    point's next runtime, inductor last. `stop_spinning`: as prepare_runtime takes it."""
    from packrat.models.zoo import prepare, resolve

    spec = resolve(model.model, model.input_shape)
    failures = []
    for runtime in dict.fromkeys((config.runtime, *config.fallbacks, DEFAULT_RUNTIME)):
        if runtime == DEFAULT_RUNTIME:
            break
        try:
            return (*load_runtime(spec, model, config, runtime, stop_spinning),
                    fell_back(config.runtime, runtime, failures))
        except Exception as exc:  # this runtime cannot serve here: the next one may
            failures.append(f"{runtime}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")
    module, examples, mode = prepare(spec, config.batch, graph_mode=model.graph_mode, compile_cache=model.compile_cache)
    return module, examples, mode, fell_back(config.runtime, DEFAULT_RUNTIME, failures)


def load_runtime(spec, model: ModelConfig, config: InstanceConfig, runtime: str, stop_spinning: bool = True):
    from packrat.models.runtimes import prepare_runtime

    module, examples = prepare_runtime(spec, runtime, config.batch, config.threads, model.compile_cache,
                                       ios_cache=model.ios_cache, cores=config.cores, stop_spinning=stop_spinning)
    return module, examples, runtime


def fell_back(planned: str, running: str, failures: list[str]) -> str | None:
    """The line saying why an instance runs `running` instead of `planned`; None if it does not."""
    if running == planned:
        return None
    return f"runs {running} instead of {planned}: " + "; ".join(failures)


def main(conn: Connection, parent: int | None = None, parent_handle: int | None = None) -> None:
    """Serve as one instance: `parent`, the pool's process (its pidfd `parent_handle`, where the
    fork server opened it), whose end this process does not outlive."""
    exit_with_parent(parent=parent, handle=parent_handle)
    model, config, codec_pickle, nice, locks = conn.recv()
    # Pinned before torch is imported (reading the codec's settings imports it) and before any
    # parallel region starts OpenMP's threads: a thread inherits the affinity of the one starting it.
    os.sched_setaffinity(0, config.cores)
    codec_config = pickle.loads(codec_pickle)
    # Niced once torch is imported, as it always was (the import came with the settings): an
    # instance niced from the start took 3x as long to come up beside a busy pool (test_pool's
    # reconfiguration under load on 2 busy cores: 37 s against 11).
    if nice:
        os.nice(nice)  # warming up beside a live pool: yield its cores to it (threads inherit this)
    import torch

    torch.set_num_interop_threads(1)
    from packrat.codec.codec import Codec

    try:
        codec = Codec(codec_config)
        # only images are worth decoding in parallel: tokenising holds the GIL, raw tensors are a copy
        decoders = Decoders(config.threads if codec.input_kind == "image" else 1)
        set_intra_op_threads(config.threads)  # after the decoders took their one each; what loading reads
        module, examples, mode, fallback = load(model, config, decoders.parallel)
        set_intra_op_threads(torch_threads(mode, config.threads))
        with torch.inference_mode():
            warm_ms = warm_up(module, examples, config.threads, lambda: holding(locks, config.cores))
        conn.send(("ready", mode, warm_ms, fallback))
    except Exception as exc:  # report why, then exit: the parent decides what to do
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    serve(conn, module, codec, decoders, config, warm_ms)


def serve(conn: Connection, module, codec, decoders: Decoders, config: InstanceConfig, warm_ms: float) -> None:
    """Answer batches until told to stop or the parent is gone. Each answer carries the stamps of
    its batch's stages here (packrat.serving.pool.stages): received, locked, decoded, run, encoded,
    and how many turns it took (turns.py)."""
    from packrat.codec.rows import InputRows, RowsLayout

    view = None  # the input segment, as a memoryview: a body is a slice of it, never a copy
    layout = RowsLayout.of(codec.config, config.slots)  # the batch's rows at its start, as the parent lays them
    rows = None
    turn = Turn(config.cores)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone: nobody to answer
            return
        received = time.monotonic()
        if message[0] == "stop":
            return
        _, items, new_segment, locks, turn_ms = message
        if new_segment:
            view = memoryview(attach(*new_segment))
            rows = InputRows(codec.config, layout, view)
        bodies = [(view[offset:offset + size], kind, header) for offset, size, kind, header in items]
        in_rows = {index for index, (offset, size, *_) in enumerate(items)
                   if index < layout.slots and offset == layout.row_offset(index) and size == layout.row_bytes}
        turn.quantum = turn_ms if locks is not None else None
        sizes = turn_sizes(len(bodies), warm_ms / config.batch, turn.quantum)
        answers, stamps = run_in_turns(conn.send, module, codec, decoders, turn, locks, Batch(bodies, rows, in_rows),
                                       sizes, received)
        conn.send(("answers", answers, stamps, len(sizes)))


class Batch(NamedTuple):
    """A sub-batch as the parent sent it: the bodies (slices of the segment), the rows over the
    segment the model reads, and which bodies the parent wrote straight into their rows."""
    bodies: list
    rows: object  # codec.rows.InputRows
    in_rows: set[int]

    def part(self, start: int, size: int) -> tuple[list, object, frozenset[int]]:
        """(bodies, rows, in_rows) of the part from `start`, as answer_batch takes them."""
        rows = self.rows.from_row(start) if self.rows is not None else None
        return (self.bodies[start:start + size], rows,
                frozenset(index - start for index in self.in_rows if start <= index < start + size))


def run_in_turns(say, module, codec, decoders: Decoders, turn: Turn, locks: str | None,
                 batch: Batch, sizes: list[int], received: float) -> tuple[list, list[float]]:
    """Answer `bodies` in parts of `sizes`, each in a turn holding the cores' locks (when `locks`),
    a new turn when the last one has run its time; the parent hears (`say(message)`: a process
    instance's socket, a thread instance's handle) when each part begins to run and when one ends
    with more to come, so its watchdog counts running, not waiting. Stamps:
    received, then decode, model and encode summed over the parts, ending when the last one did
    (the waits for turns all fall in the "locks" stage)."""
    answers, spent, start = [], [0.0, 0.0, 0.0], 0
    for number, size in enumerate(sizes):
        part, rows, in_rows = batch.part(start, size)
        start += size
        if number and turn.spent(turn.quantum):
            turn.end()
            say(("waiting",))
        turn.begin(locks)
        laps = [time.monotonic()]
        if locks is not None:  # it runs from now: the parent's watchdog counts from here
            say(("locked", laps[0]))
        answers += answer_batch(module, codec, part, decoders.mapper(len(part) - len(in_rows)), laps, rows, in_rows)
        for stage in range(3):
            spent[stage] += laps[stage + 1] - laps[stage]
    # The turn ends with the batch, before its answers go: the cores are held only while the parent
    # knows the batch runs, so its watchdog sees a holder that stops (turns.py says why no longer)
    turn.end()
    stamps = [received, laps[-1] - sum(spent)]
    for seconds in spent:
        stamps.append(stamps[-1] + seconds)
    return answers, stamps
