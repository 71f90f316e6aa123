"""Instance lifecycles: starting the pool's instances, noticing a death, respawning with back-off,
the watchdog that kills a hung instance, whether requests can still be served, and switching to a
new set of instances (reconfiguration). Queues and answers are the dispatcher's; this module only
hands a lost instance's requests back through the `requeue` callback.

Recovery policy. A dead instance (killed, out of memory, a crash in a native decoder, or killed by
the watchdog) is respawned in the background, retried with back-off (1 s doubling to 30 s) for as
long as the pool lives, each failure logged. While a respawn has a fair chance (its last attempt was
killed by a signal, or fewer than `load_attempts` attempts in a row failed while loading), requests
wait in the queue, bounded by their deadline. When every instance's last `load_attempts` attempts
failed while loading the model, the model cannot be loaded: queued and new requests are answered
503 at once with the load error, until an instance comes back.

A hung thread instance (thread_instance.py) cannot be killed: its run is cancelled, its requests
handed back at once, and its thread given the watchdog's allowance to return. One that does not
(stuck in Python, a decoder, a lock: anything but the runtime's cancellable run) is abandoned and
its cores fenced off: no instance is started on them while it holds them, and `on_fence(cores)`
tells the engine, which re-plans on the cores left (engine.py). When the thread returns, its cores
are unfenced (`on_fence` again) and its slot, if a re-plan has not retired it, respawned. With
every instance fenced, no cores are left: requests are answered 503 with that reason
(`unavailable`), which front ends report as not ready, and the engine restarts its process.

A thread instance whose load does not return within `start_timeout` is fenced the same way (a
process on its cores would share them with a thread that may still run); one whose load failed
(raised) gives way to a process instance on the same cores (`ready`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Sequence

from packrat.codec.config import CodecConfig
from packrat.errors import PoolError
from packrat.models.runtimes import instance_kind, process_kind
from packrat.serving.pool.api import InstanceConfig, ModelConfig
from packrat.serving.pool.core_locks import holders
from packrat.serving.pool.instance import Instance, StartFailed
from packrat.serving.pool.thread_instance import ThreadInstance
from packrat.settings import HANG_FACTOR, HANG_FLOOR_S  # the watchdog's defaults, declared with the schema

log = logging.getLogger("packrat.serving.pool")

BACKOFF_S = (1.0, 30.0)  # first and longest wait between respawn attempts
LOAD_ATTEMPTS = 3  # attempts in a row that failed while loading before the model counts as unloadable


@dataclass(frozen=True)
class Watchdog:
    """When a running batch marks its instance hung. Its yardstick is the larger of the profile's
    L(t, b) (InstanceConfig.expected_ms) and the instance's own warm-up time for its planned batch
    (child.warm_up: without the time it waited for a core), scaled up for a batch above the plan;
    `batch_timeout_s` replaces the whole rule."""

    factor: float = HANG_FACTOR
    floor_s: float = HANG_FLOOR_S
    batch_timeout_s: float | None = None

    def allowance_s(self, config: InstanceConfig, warm_ms: float, requests: int) -> float:
        if self.batch_timeout_s:
            return self.batch_timeout_s
        expected_ms = max(config.expected_ms or 0.0, warm_ms) * max(1.0, requests / config.batch)
        return max(self.floor_s, self.factor * expected_ms / 1e3)

    def overdue(self, instances: Iterable, now: float,
                silent_hold_since: Callable[[Instance], float | None] = lambda _: None) -> list:
        """Instances whose current batch has run past its allowance. A batch waiting for its turn on
        cores another model holds is not running: its clock starts when the turn does. An instance
        that has waited past its allowance is asked about (`silent_hold_since`): one seen holding
        its cores without having said so (it took them and stopped, holding every other model on
        them off) is timed from when it was first seen so."""
        found = []
        for inst in instances:
            if not inst.jobs or inst.hung:
                continue
            allowance = self.allowance_s(inst.config, inst.warm_ms, len(inst.jobs))
            start = inst.busy_since
            if inst.waiting_turn and now - start > allowance:
                start = silent_hold_since(inst)
            if start is not None and now - start > allowance:
                found.append(inst)
        return found


class StuckLoading(StartFailed):
    """A thread instance's load did not return within the start timeout: its cores are fenced."""


class Slot:
    """What the supervisor remembers of one planned instance across its respawns."""

    def __init__(self) -> None:
        self.load_failures = 0  # attempts in a row that failed while loading (not killed by a signal)
        self.last_by_signal = False
        self.last_error = ""

    def failed(self, exc: StartFailed) -> None:
        self.last_by_signal, self.last_error = exc.by_signal, str(exc)
        if not exc.by_signal:
            self.load_failures += 1

    def hopeless(self, attempts: int) -> bool:
        return self.load_failures >= attempts and not self.last_by_signal


class Supervisor:
    """The pool's instances and their lifecycles. Shares the pool's lock; `requeue(jobs, why)` hands a
    lost instance's requests back, `wake()` tells the dispatch loop that something changed."""

    def __init__(self, model: ModelConfig, codec: CodecConfig, lock: threading.RLock, closed: threading.Event,
                 requeue: Callable[[list, str], None], wake: Callable[[], None], *, start_timeout: float = 600.0,
                 watchdog: Watchdog = Watchdog(), load_attempts: int = LOAD_ATTEMPTS, thread_done=None,
                 on_fence: Callable[[frozenset], None] | None = None):
        self.model, self.codec, self._lock, self._closed = model, codec, lock, closed
        self._requeue, self._wake = requeue, wake
        self._thread_done = thread_done  # the pool's: a thread instance's answers or failure (thread_instance.Done)
        self._on_fence = on_fence  # told the fenced cores whenever they change (called without the lock)
        self.start_timeout, self.watchdog, self.load_attempts = start_timeout, watchdog, load_attempts
        self.instances: list[Instance] = []
        self.parked: list[Instance] = []  # retired by the last switch; reused if the plan comes back
        self.core_locks: str | None = None  # while the cores are time-shared: the node's core-lock directory
        self.turn_ms: float | None = None  # and the longest turn an instance takes on them
        self.respawns = self.respawning = self.respawn_failures = self.watchdog_kills = 0
        self.abandoned = 0  # thread instances left stuck in a cancelled run since the start
        self.fenced: list[ThreadInstance] = []  # those still stuck: their cores are left out
        self._silent_holds: dict[tuple[int, float], float] = {}  # (pid, batch sent) -> first seen holding

    def spawn(self, config: InstanceConfig, index: int, nice: int = 0, slot: Slot | None = None) -> Instance:
        if instance_kind(config.runtime) == "thread":
            inst = ThreadInstance(index, self.model, config, self.codec, self._thread_done, nice, self.core_locks)
        else:
            inst = Instance(index, self.model, config, self.codec, nice, self.core_locks)
        inst.turn_ms = self.turn_ms
        inst.slot = slot or Slot()  # carried from one respawn attempt to the next
        return inst

    def start(self, configs: Sequence[InstanceConfig]) -> str:
        """Start every instance and wait for all; their graph mode (that of torch's instances where
        some run another runtime). PoolError (and nothing left running) if one fails. A thread
        instance stuck loading stays in its place, fenced (`ready`): the others serve, the engine
        re-plans without its cores, and its slot is respawned once its thread returns."""
        self.instances = [self.spawn(config, i) for i, config in enumerate(configs)]
        for position, inst in enumerate(list(self.instances)):
            try:
                started = self.ready(inst)
            except StuckLoading:
                continue  # left in its place, fenced: its respawn, once its thread returns, takes the place
            with self._lock:
                self.instances[position] = started
        modes = [(inst.mode, config) for inst, config in zip(self.instances, configs) if inst.ready]
        return next((m for m, c in modes if c.runtime == "inductor"), modes[0][0] if modes else "")

    def ready(self, inst, nice: int = 0):
        """`inst` once it has loaded (wait_ready). A thread instance that cannot start (its runtime is
        missing, say) gives way to a process instance of the same runtime on the same cores, which
        falls back to the point's other runtimes as any process instance does. One whose load has
        not returned within `start_timeout` is fenced like a hung thread (its cores left out until
        its thread returns, then its slot respawned if still planned) and StuckLoading raised."""
        try:
            inst.wait_ready(self.start_timeout)
            return inst
        except StartFailed as exc:
            if inst.kind != "thread":
                raise
            inst.close(timeout=0)  # its thread ends once its load returns, if it does
            if inst.loading:  # a process pinned beside a thread still loading would share its cores with it
                self._fence(inst, f"did not return from its load within {self.start_timeout:.0f} s")
                threading.Thread(target=self._respawn, args=(inst, True), daemon=True, name="packrat-fence").start()
                raise StuckLoading(f"{exc}: its thread is still loading; cores {list(inst.config.cores)} "
                                   f"fenced off until it returns") from None
            config = replace(inst.config, runtime=process_kind(inst.config.runtime))
            log.warning("instance %d runs as a process: %s", inst.index, exc)
            process = self.spawn(config, inst.index, nice, inst.slot)
            process.wait_ready(self.start_timeout)
            process.fallback = process.fallback or f"runs as a process: its thread did not start ({exc})"
            return process

    def serving(self) -> list[Instance]:
        """Instances that may hold requests: the current ones and those a switch parked."""
        return [inst for inst in self.instances + self.parked if inst.ready]

    # ---- deaths, respawns, the watchdog (caller holds the lock unless said otherwise) ----------

    def silent_hold_since(self, inst: Instance) -> float | None:
        """When the instance, whose batch it says waits for a turn, was first seen holding the lock
        of every core it has (the kernel's word, /proc/locks, not its own); None while it does not.
        One that just took them and is about to say so is seen once and let be. A thread instance is
        never asked: it says so in the same call that takes them (no silence to see), and /proc/locks
        names the process, which every thread instance in it shares."""
        if inst.kind == "thread":
            return None
        key = (inst.pid, inst.busy_since)  # this batch's wait
        try:
            held = holders(inst.locks, inst.config.cores) if inst.locks is not None else {}
        except OSError:
            held = {}
        if not all(held.get(core) == inst.pid for core in inst.config.cores):
            self._silent_holds.pop(key, None)
            return None
        return self._silent_holds.setdefault(key, time.monotonic())

    def kill_overdue(self, now: float) -> None:
        waiting = {(inst.pid, inst.busy_since) for inst in self.instances + self.parked if inst.waiting_turn}
        self._silent_holds = {key: at for key, at in self._silent_holds.items() if key in waiting}
        for inst in self.watchdog.overdue(self.instances + self.parked, now, self.silent_hold_since):
            allowance = self.watchdog.allowance_s(inst.config, inst.warm_ms, len(inst.jobs))
            how = "holds its cores' locks without running" if inst.waiting_turn else "has run"
            log.error("instance %d (cores %s, %s) hung: a batch of %d %s %.1f s (allowance %.1f s); "
                      "killing it, its requests run again elsewhere", inst.index, list(inst.config.cores),
                      who(inst), len(inst.jobs), how, now - inst.busy_since, allowance)
            inst.hung = True
            self.watchdog_kills += 1
            inst.kill()  # a process's socket closes: lost() follows from the dispatch loop
            if inst.kind == "thread":  # its run is cancelled; its requests go now, whether or not it returns
                self.lost(inst)

    def lost(self, dead: Instance) -> None:
        """A dead instance: its requests handed back, a respawn started (unless a switch had retired it)."""
        dead.ready = False
        why = "hung: killed by the watchdog" if dead.hung else f"died with exit code {exit_code(dead)}"
        jobs, dead.jobs = dead.jobs, []
        self._requeue(jobs, f"instance {dead.index} {why}")
        if dead in self.parked:
            self.parked.remove(dead)
            dead.close(timeout=0)
            if dead.kind == "thread" and dead.hung:  # nothing to respawn, but its cores may have to be fenced
                threading.Thread(target=self._fence_if_stuck, args=(dead,), daemon=True, name="packrat-fence").start()
            return
        if dead not in self.instances:
            return
        log.warning("instance %d (cores %s) %s; respawning", dead.index, list(dead.config.cores), why)
        self.respawns += 1
        self.respawning += 1
        dead.close(timeout=0)
        threading.Thread(target=self._respawn, args=(dead,), daemon=True, name="packrat-respawn").start()

    def _respawn(self, dead: Instance, fenced: bool = False) -> None:
        """Start a replacement until one comes up (back-off between attempts) or the pool moves on.
        Runs in its own thread, without the lock while a replacement loads. A hung thread instance
        that does not return is fenced first (`fenced`: it already is, stuck loading); its slot is
        respawned once it returns (if still planned)."""
        delay, attempt, current, config = BACKOFF_S[0], 0, dead, dead.config
        if fenced or self._abandon(dead):
            if not self._await_return(dead):
                return
            with self._lock:
                if self._closed.is_set() or dead not in self.instances:  # a re-plan retired it meanwhile
                    return
                self.respawning += 1
        while True:
            with self._lock:
                if self._closed.is_set() or current not in self.instances:  # closed, or retired by a switch
                    self.respawning -= 1
                    return
                attempt += 1
                try:
                    fresh = self.spawn(config, dead.index, slot=current.slot)
                except OSError as exc:  # no process at all (out of memory, too many files): try again later
                    fresh = None
                    log.error("respawning instance %d failed (attempt %d): %s", dead.index, attempt, exc)
                else:
                    self.instances[self.instances.index(current)] = current = fresh
            if fresh is None:
                delay = self._back_off(delay)
                continue
            try:
                fresh.wait_ready(self.start_timeout)
            except (StartFailed, OSError) as exc:
                fresh.close(timeout=0)
                with self._lock:
                    if self._closed.is_set() or fresh not in self.instances:
                        continue  # stopped on purpose: not a failure
                    self.respawn_failures += 1
                    fresh.slot.failed(exc if isinstance(exc, StartFailed) else StartFailed(str(exc)))
                log.error("respawning instance %d failed (attempt %d): %s; retrying in %.0f s",
                          dead.index, attempt, exc, delay)
                self._wake()  # queued requests may now have to be refused
                delay = self._back_off(delay)
                continue
            with self._lock:
                self.respawning -= 1
                fresh.slot = Slot()
            log.info("instance %d respawned (attempt %d)", dead.index, attempt)
            self._wake()
            return

    def _fence_if_stuck(self, dead) -> None:
        if self._abandon(dead, respawning=False):
            self._await_return(dead)

    def _abandon(self, dead, respawning: bool = True) -> bool:
        """Whether `dead` is a hung thread instance whose cancelled run did not return within the
        watchdog's allowance: then it is abandoned, its cores fenced off (nothing can stop a thread;
        an instance pinned beside it would share its cores with it for good) and the engine told."""
        if dead.kind != "thread" or not dead.hung:
            return False
        dead.worker.thread.join(self.watchdog.allowance_s(dead.config, dead.warm_ms, dead.config.batch))
        if not dead.stuck:
            return False
        self._fence(dead, "did not return from its cancelled run", respawning)
        return True

    def _fence(self, inst, what: str, respawning: bool = False) -> None:
        """Abandon the thread instance `inst`, whose thread `what`: its cores fenced off, the engine told."""
        with self._lock:
            inst.abandoned = True
            self.fenced.append(inst)
            self.abandoned += 1
            self.respawning -= respawning  # nothing is started for it while it holds its cores
        log.error("instance %d's thread (cores %s, %s) %s: abandoned, its cores fenced off until it returns",
                  inst.index, list(inst.config.cores), who(inst), what)
        self._fences_changed()

    def _await_return(self, dead) -> bool:
        """Until the abandoned thread of `dead` returns (then its cores are unfenced: True) or the
        pool closes (False)."""
        while dead.worker.alive:
            if self._closed.is_set():
                return False
            dead.worker.thread.join(1.0)  # one look a second, and only while a thread is stuck
        with self._lock:
            self.fenced.remove(dead)
        log.warning("instance %d's abandoned thread returned: cores %s unfenced", dead.index, list(dead.config.cores))
        self._fences_changed()
        return True

    def fenced_cores(self) -> frozenset:
        """The cores abandoned threads still hold."""
        with self._lock:
            return frozenset(core for inst in self.fenced for core in inst.config.cores)

    def _fences_changed(self) -> None:
        self._wake()  # queued requests may now have to be refused, or may run again
        if self._on_fence is not None and not self._closed.is_set():  # a closed pool re-plans nothing
            try:
                self._on_fence(self.fenced_cores())
            except Exception:  # the engine's re-plan must not end this thread
                log.exception("re-planning around the fenced cores failed")

    def _back_off(self, delay: float) -> float:
        """Wait `delay` (less if the pool closes); the next, doubled up to BACKOFF_S[1]."""
        self._closed.wait(delay)
        return min(delay * 2, BACKOFF_S[1])

    def unavailable(self) -> str | None:
        """Why no request can be run now, or None: no cores are left (every instance is an abandoned
        thread), or the model cannot be loaded (every instance's last attempts failed while
        loading). A respawn with a fair chance is waited for."""
        if any(inst.ready for inst in self.instances):
            return None
        if self.instances and all(inst in self.fenced for inst in self.instances):
            cores = sorted(core for inst in self.instances for core in inst.config.cores)
            return (f"no cores left to serve on: the thread of every instance (cores {cores}) is stuck in a run "
                    f"that did not return when cancelled; a restart of the server frees them")
        slots = [inst.slot for inst in self.instances]
        if slots and all(slot.hopeless(self.load_attempts) for slot in slots):
            return (f"the model cannot be loaded: the last {self.load_attempts} attempts to start an instance "
                    f"failed ({slots[-1].last_error}); retrying in the background")
        return None

    # ---- reconfiguration ------------------------------------------------------------------------

    def reconfigure(self, configs: Sequence[InstanceConfig], warmup_nice: int = 10) -> dict[str, int]:
        """Switch to new instances without stopping service (called without the lock).

        Instances whose threads and cores stay (and that can take the new share) are kept and
        only get their new share; so are instances parked by the previous switch, which makes
        switching back and forth between two plans instant. The others are started beside the
        live ones at low priority, warmed up, and swapped in: from then on only they get new
        requests, while retired instances finish the requests they hold and are parked (idle,
        blocked on their socket: memory but no CPU) until the next switch that retires others.
        Thread counts of live instances never change. If a new instance fails to start, the pool
        is left as it was and PoolError raised (a thread instance stuck loading is fenced first:
        the engine's re-plan that follows leaves its cores out).
        """
        fenced = self.fenced_cores() & {core for config in configs for core in config.cores}
        if fenced:  # a plan made before the fence: the re-plan that follows it leaves them out
            raise PoolError(f"cores {sorted(fenced)} are fenced off: an abandoned thread instance holds them")
        with self._lock:
            active, parked = list(self.instances), list(self.parked)
        kept = match(configs, active + parked)
        fresh: dict[int, Instance] = {}
        try:
            for position, config in enumerate(configs):
                if position not in kept:
                    fresh[position] = self.spawn(config, position, warmup_nice)
            for position, inst in fresh.items():
                fresh[position] = self.ready(inst, warmup_nice)
        except BaseException:
            close_all(fresh.values())
            raise
        if fresh and not all(inst.restore_priority() for inst in fresh.values()):
            log.warning("new instances keep nice %d: lowering it back needs CAP_SYS_NICE", warmup_nice)
        reused = set(map(id, kept.values()))
        with self._lock:
            closed = self._closed.is_set()  # closed while they started: the pool's close stopped the rest
            stopped, parked = (list(fresh.values()), 0) if closed else self._swap_in(configs, kept, fresh, reused)
        self._wake()
        close_all(stopped)
        if closed:
            raise PoolError("the pool was closed during the switch")
        return {"kept": len(kept), "started": len(fresh), "parked": parked, "stopped": len(stopped)}

    def _swap_in(self, configs, kept: dict, fresh: dict, reused: set) -> tuple[list[Instance], int]:
        """The switch itself (caller holds the lock): the kept and fresh instances serve from now on,
        the retired ones are parked. The instances to stop (their requests queued again), and how
        many were parked."""
        retired = [inst for inst in self.instances if id(inst) not in reused]
        still_parked = [inst for inst in self.parked if id(inst) not in reused]
        for position, inst in kept.items():
            inst.config = configs[position]
            inst.index = position
        self.instances = [kept.get(p) or fresh[p] for p in range(len(configs))]
        if retired:  # park this switch's leftovers; the older parked ones go
            self.parked, stopped = [i for i in retired if i.ready], still_parked + [i for i in retired
                                                                                     if not i.ready]
        else:
            self.parked, stopped = still_parked, []
        for inst in stopped:  # still busy with an earlier switch's requests: they run again elsewhere
            jobs, inst.jobs = inst.jobs, []
            self._requeue(jobs, f"instance {inst.index} was stopped by a reconfiguration")
        return stopped, len(retired)

    def close(self) -> list:
        """Stop every instance (caller has stopped dispatch); the jobs they held."""
        with self._lock:
            instances, self.instances, self.parked = self.instances + self.parked, [], []
            jobs = [job for inst in instances for job in inst.jobs]
        close_all(instances)
        return jobs


def close_all(instances: Iterable[Instance], timeout: float = 5.0) -> None:
    """Close instances side by side: all told to stop first, then each waited for (within
    `timeout` of the first being told), so stopping N instances takes one exit, not N."""
    instances = list(instances)
    for inst in instances:
        inst.stop()
    deadline = time.monotonic() + timeout
    for inst in instances:
        inst.close(max(0.0, deadline - time.monotonic()))


def who(inst) -> str:
    """An instance for a log line: its process, or its thread within the serving process."""
    return f"thread {inst.tid} of pid {inst.pid}" if inst.kind == "thread" else f"pid {inst.pid}"


def exit_code(inst: Instance) -> int | None:
    """Its exit code, waiting a moment for it to be reaped (its socket closes just before)."""
    try:
        return inst.process.wait(1)
    except Exception:  # still running (a stopped process being killed): say so
        return None


def match(configs: Sequence[InstanceConfig], candidates: list[Instance]) -> dict[int, Instance]:
    """Position in `configs` -> a ready instance with the same threads, cores and runtime."""
    kept: dict[int, Instance] = {}
    for position, config in enumerate(configs):
        found = next((inst for inst in candidates if inst.ready and inst.alive and inst not in kept.values()
                      and (inst.config.threads, inst.config.cores, inst.config.runtime)
                      == (config.threads, config.cores, config.runtime)), None)
        if found is not None:
            kept[position] = found
    return kept
