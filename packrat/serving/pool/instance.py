"""The parent's handle on one instance process: starting it, the shared-memory transport of its
requests' bodies, and stopping or killing it. Knows nothing of queues or policies."""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path

import psutil

from packrat.codec.rows import RowsLayout
from packrat.codec.config import CodecConfig
from packrat.errors import PoolError
from packrat.serving.pool import forkserver
from packrat.serving.pool.api import InstanceConfig, ModelConfig
from packrat.settings import FORK_INSTANCES_ENV

log = logging.getLogger("packrat.serving.pool")

MIN_SEGMENT_BYTES = 1 << 20
SEGMENT_PREFIX = "packrat-"  # /dev/shm/packrat-<owner pid>-<n>: sweep_stale_segments can tell whose it is
SHM_DIR = Path("/dev/shm")
_segment_numbers = itertools.count()


class StartFailed(PoolError):
    """An instance did not come up. `by_signal`: it was killed from outside while it loaded (not the
    model's fault, so another attempt has a fair chance)."""

    def __init__(self, message: str, by_signal: bool = False):
        super().__init__(message)
        self.by_signal = by_signal


def sweep_stale_segments(shm_dir: Path = SHM_DIR) -> list[str]:
    """Unlink input segments whose owner process is gone (a worker killed with -9 cannot unlink its
    own); returns their names. Runs when a pool starts, so a restarted worker comes up clean."""
    swept = []
    for path in shm_dir.glob(f"{SEGMENT_PREFIX}*"):
        try:
            owner = int(path.name[len(SEGMENT_PREFIX):].split("-")[0])
        except ValueError:
            continue
        if owner != os.getpid() and not psutil.pid_exists(owner):
            path.unlink(missing_ok=True)
            swept.append(path.name)
    return swept


def start_process(child_fd: int, runtime: str):
    """An instance process serving on `child_fd`: forked from the fork server (forkserver.py), or a
    fresh interpreter where that cannot be had, is turned off (FORK_INSTANCES_ENV), or the
    instance's environment is its own (IOS sets OpenMP's, which OpenMP reads as it loads). Not this
    process forked: that would copy the server's threads and torch state."""
    env = None
    if runtime == "ios":
        from packrat.ios_scheduler.openmp import openmp_env

        env = openmp_env()
    elif FORK_INSTANCES_ENV.get():
        forked = forkserver.spawn(child_fd, os.getpid())
        if forked is not None:
            return forked
    return subprocess.Popen([sys.executable, "-m", "packrat.serving.pool", str(child_fd), str(os.getpid())],
                            pass_fds=(child_fd,), env=env)


class Instance:
    """One instance process, its input segment and the jobs it runs."""

    kind = "process"  # beside thread_instance.ThreadInstance's "thread"

    def __init__(self, index: int, model: ModelConfig, config: InstanceConfig, codec: CodecConfig, nice: int = 0,
                 locks: str | None = None):
        self.index, self.config = index, config
        self.layout = RowsLayout.of(codec, config.slots)  # where the batch's rows lie in the segment
        self.ready = False  # set once the instance has loaded its model and takes work
        self.mode = ""
        self.fallback: str | None = None  # why it runs another runtime than its config's, if it does
        self.warm_ms = 0.0  # a full planned batch, timed in its warm-up
        self.jobs: list = []  # the dispatcher's jobs it runs now
        self.busy_since = 0.0  # monotonic time its current jobs were sent, or began to run after a turn's wait
        self.waiting_turn = False  # its batch waits for another model's turn on its cores (not running yet)
        self.sent_stamps: tuple[float, ...] = ()  # their stamps up to the send (stages.py)
        self.hung = False  # killed by the watchdog
        self.locks = locks  # the node's core-lock directory while its cores are time-shared
        self.turn_ms: float | None = None  # then, the longest turn: a longer batch runs in several
        self.sent_locked = False  # whether the batch it runs now holds the core locks
        self.slot = None  # the supervisor's memory of this instance's respawn attempts
        self.segment: SharedMemory | None = None
        self._stopping = False  # stop() was called: asked to exit, or killed
        parent_sock, child_sock = socket.socketpair()
        self.conn = Connection(parent_sock.detach())
        child_fd = child_sock.detach()
        self.process = start_process(child_fd, config.runtime)
        os.close(child_fd)  # our copy: the socket must close when the child exits
        try:
            # The codec's settings pickled apart: reading them imports torch, which the instance
            # does only once it is pinned (threads started on import inherit the affinity).
            self.conn.send((model, config, pickle.dumps(codec), nice, locks))
        except OSError:  # it died before it could be told what to load: wait_ready says how
            pass

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float) -> str:
        """Block until the instance has loaded and warmed up its model; returns its mode.
        Raises StartFailed saying why it did not."""
        if not self.conn.poll(timeout):
            raise StartFailed(f"instance {self.index} did not start within {timeout:.0f} s")
        try:
            message = self.conn.recv()
        except (EOFError, OSError):
            code = self.process.wait()
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            raise StartFailed(f"instance {self.index} exited while starting ({how})", by_signal=code < 0) from None
        if message[0] == "failed":
            raise StartFailed(f"instance {self.index} failed to start: {message[1]}")
        _, self.mode, self.warm_ms, self.fallback = message
        if self.fallback:
            log.warning("instance %d %s", self.index, self.fallback)
        self.ready = True
        return self.mode

    def restore_priority(self) -> bool:
        """Back to normal priority after a low-priority warm-up (every thread: Linux
        keeps a nice value per thread). Lowering nice needs CAP_SYS_NICE."""
        try:
            for thread in psutil.Process(self.pid).threads():
                os.setpriority(os.PRIO_PROCESS, thread.id, 0)
            return True
        except (PermissionError, psutil.Error, ProcessLookupError):
            return False

    def submit(self, jobs: list) -> None:
        """Write the bodies into the input segment (grown when they do not fit) and send their places.
        A body of exactly one sample of the model's first input (a raw tensor) goes straight into
        its request's row of the batch (codec.rows.RowsLayout), which the model reads as it is;
        other bodies go after the rows, where the instance decodes them into their rows.
        The sub-batch's stamps up to the send (stages.py) are kept in `sent_stamps`."""
        dispatched = time.monotonic()
        layout = self.layout
        places, offset = [], layout.size
        for index, job in enumerate(jobs):
            size = len(job.request.body)
            if index < layout.slots and size == layout.row_bytes:
                places.append(layout.row_offset(index))
            else:
                places.append(offset)
                offset += size
        new_segment = None
        if self.segment is None or self.segment.size < offset:
            self._release_segment()
            name = f"{SEGMENT_PREFIX}{os.getpid()}-{next(_segment_numbers)}"
            self.segment = SharedMemory(name, create=True, size=max(MIN_SEGMENT_BYTES, 1 << (offset - 1).bit_length()))
            new_segment = (self.segment.name, self.segment.size)
        items, buffer = [], self.segment.buf
        for job, place in zip(jobs, places):
            body = job.request.body  # bytes, bytearray or memoryview: copied once, straight into the segment
            buffer[place:place + len(body)] = body
            items.append((place, len(body), job.request.content_type, job.request.header_length))
        copied = time.monotonic()
        message = ForkingPickler.dumps(("infer", items, new_segment, self.locks, self.turn_ms))  # what conn.send would do
        sending = time.monotonic()  # before the write: the instance may run before the write returns to us
        self.jobs, self.busy_since, self.sent_locked = jobs, sending, self.locks is not None
        self.waiting_turn = self.sent_locked
        self.sent_stamps = (min(job.queued_at for job in jobs), dispatched, copied, sending)
        self.conn.send_bytes(message)

    def receive(self) -> tuple[list, list[float], int] | None:
        """The answers to its current jobs, the instance's stamps of their stages (stages.py) and the
        turns they took; None when it only said a turn began (it holds its cores' locks: from then
        on its batch runs, and the watchdog's clock starts) or ended with more to come (waiting
        again); EOFError/OSError once it died."""
        message = self.conn.recv()
        if message[0] in ("locked", "waiting"):
            if message[0] == "locked":
                self.busy_since = message[1]
            self.waiting_turn = message[0] == "waiting"
            return None
        _, answers, stamps, turns = message
        self.waiting_turn = False
        return answers, stamps, turns

    @property
    def working(self) -> int:
        """Requests it runs now on cores it holds (none while its batch waits for a turn)."""
        return 0 if self.waiting_turn else len(self.jobs)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def idle(self) -> bool:
        return self.ready and not self.jobs

    def kill(self) -> None:
        """SIGKILL (works on a stopped process too); its socket then closes and the pool sees it die."""
        try:
            self.process.kill()
        except OSError:
            pass

    def _release_segment(self) -> None:
        if self.segment is not None:
            self.segment.close()
            self.segment.unlink()
            self.segment = None

    def stop(self) -> None:
        """Tell it to exit, without waiting for it (close() waits), so that a pool's instances all
        stop at once. A serving instance reads the request after the batch it runs; one still
        loading would read it only once loaded, so it is killed now rather than after close()'s
        timeout."""
        if self._stopping:
            return
        self._stopping, serving, self.ready = True, self.ready, False
        if not serving:
            self.kill()
            return
        try:
            self.conn.send(("stop",))
        except OSError:  # already gone
            pass

    def close(self, timeout: float = 5.0) -> None:
        """Stop it (unless stop() already asked), wait up to `timeout` for it to exit, else kill it;
        free its segment."""
        self.stop()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.conn.close()
        self._release_segment()
