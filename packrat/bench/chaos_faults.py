"""packrat bench chaos's faults (chaos.py runs them): one TorchServe's processes and segments tracked
and sampled, and each fault struck and watched until the server is at full strength again."""

from __future__ import annotations

import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import psutil

from packrat.bench import faults
from packrat.bench.harness import Periodic, bounded
from packrat.bench.resources import SHM_PREFIXES, owned_segments, segment_owner, shm_segments
from packrat.bench.results import fmt_num
from packrat.deploy import torchserve
from packrat.frontends import torchserve_control

WORKER_MARKER = "model_service_worker"  # TorchServe's Python worker: python .../ts/model_service_worker.py
POLL_S = 0.25  # recovery polling
STATUS_WAIT_S = 5.0  # the longest wait for the handler's status while polling
PRE_FAULT_STATUS_WAIT_S = 2.0  # ... and right before a fault (its counters), which it delays
REPLACE_POLL_S = 0.02  # double-kill: how often to look for the replacement


def reconfigure_target(n: int, batch: int) -> int:
    """The batch the n-th forced reconfiguration (0-based) switches to: B//2 (at least 1), B, B//2, ..."""
    return max(1, batch // 2) if n % 2 == 0 else batch


def logged_worker_pids(model_log: str) -> set[int]:
    """Every Python worker TorchServe started, from the "[PID]1234" line each writes to model_log.log."""
    return {int(pid) for pid in re.findall(r"\[PID\](\d+)", model_log)}


# ---- the server's processes, memory and segments ------------------------------------------------

def reaped(proc: psutil.Process) -> bool:
    """Gone from the process table (or its pid reused). A zombie is not: its parent has not noticed yet."""
    return not proc.is_running()


class Tracker:
    """Every worker and instance process, and every segment, seen under the server during the run."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.processes: dict[int, psutil.Process] = {}
        self.segments: set[str] = set()
        self._lock = threading.Lock()

    def served(self) -> tuple[list[psutil.Process], list[psutil.Process]]:
        """(TorchServe's Python workers, the pool instances under them), both remembered."""
        java = faults.torchserve_pid(self.run_dir)
        if java is None:
            return [], []
        workers, instances = faults.pool_instances(java, WORKER_MARKER), faults.pool_instances(java)
        with self._lock:
            self.processes.update((p.pid, p) for p in workers + instances)
        return workers, instances

    def logged_workers(self) -> set[int]:
        """Workers too short-lived to be seen (e.g. TorchServe's restarts after a worker kill)."""
        try:
            return logged_worker_pids((self.run_dir / "logs" / "model_log.log").read_text(errors="replace"))
        except OSError:
            return set()

    def sample(self) -> dict:
        workers, instances = self.served()
        rss = fds = 0
        for proc in workers + instances:
            try:
                rss += proc.memory_info().rss
                fds += proc.num_fds()
            except psutil.Error:
                continue
        pids = {p.pid for p in workers + instances}
        present, ours = shm_segments(), owned_segments(pids)
        with self._lock:
            self.segments |= ours
        found = bool(workers or instances)  # none: the server is down, not lean
        return {"time": time.time(), "workers": len(workers), "instances": len(instances),
                "worker_pids": sorted(w.pid for w in workers),
                "rss_mb": rss / 2**20 if found else None, "fds": fds if found else None,
                "shm": {prefix: sum(n.startswith(prefix) for n in present) for prefix in SHM_PREFIXES},
                "segments": sorted(ours)}

    def leftovers(self, grace_s: float, shm_before: set[str]) -> dict:
        """What of this server is still there after its stop, waiting up to grace_s for it to go."""
        temp = str(torchserve.Server.load(self.run_dir).temp_dir)  # the TEMP its processes were given
        start = time.monotonic()
        while True:
            processes = self._our_processes(temp)
            with self._lock:
                pids = set(self.processes) | {p["pid"] for p in processes} | self.logged_workers()
                ours = self.segments | {n for n in shm_segments() if segment_owner(n) in pids}
            segments = sorted(ours & shm_segments())
            if (not processes and not segments) or time.monotonic() - start >= grace_s:
                break
            time.sleep(0.5)
        return {"processes": processes, "segments": segments, "waited_s": time.monotonic() - start,
                "new_shm_any_owner": sorted(shm_segments() - shm_before)}

    def _our_processes(self, temp: str) -> list[dict]:
        with self._lock:
            seen = dict(self.processes)
        found = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            what = "instance" if faults.POOL_MARKER in cmdline else "worker" if WORKER_MARKER in cmdline else None
            if what is None:
                continue
            try:
                ours = proc.environ().get("TEMP") == temp
            except psutil.Error:
                ours = False
            if ours or (proc.pid in seen and seen[proc.pid].is_running()):
                found.append({"pid": proc.pid, "what": what})
        return found


class Sampler(Periodic):
    """Resource samples every every_s seconds in a thread, plus those taken by hand."""

    def __init__(self, tracker: Tracker, every_s: float, log: Callable[[str], None]):
        super().__init__(every_s, "chaos-sampler")
        self.tracker, self.log = tracker, log
        self.samples: list[dict] = []

    def take(self, label: str) -> dict:
        sample = {**self.tracker.sample(), "label": label}
        self.samples.append(sample)
        self.log(f"sample ({label}): RSS {fmt_num(sample['rss_mb'], 0)} MB, {fmt_num(sample['fds'], 0)} fds, "
                 f"{sample['workers']} worker(s), {sample['instances']} instance(s), /dev/shm {sample['shm']}")
        return sample

    def tick(self) -> None:
        self.take("periodic")


# ---- faults ------------------------------------------------------------------------------------

@dataclass
class Fault:
    n: int
    kind: str
    at: float  # unix time of the fault (the first kill of a double-kill)
    offset_s: float  # seconds after the first request
    pids: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    recovery_s: float | None = None  # None: not back at full strength before the next fault
    target_batch: int | None = None  # reconfigure
    caught_loading: bool | None = None  # double-kill: the replacement died while loading (a respawn failure)
    replacement_age_s: float | None = None  # double-kill: its age when killed
    continued_at: float | None = None  # stop: when SIGCONT was sent (None: never, e.g. gone before)
    health_delta: dict = field(default_factory=dict)  # pool counters from before the fault to its recovery
    victims: list = field(default_factory=list, repr=False)  # psutil.Process
    pre_pids: set = field(default_factory=set, repr=False)  # worker: the workers before it
    health_before: dict | None = field(default=None, repr=False)

    def to_json(self) -> dict:
        """The public fields (psutil handles and bookkeeping left out), lists copied."""
        return {f.name: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
                for f in fields(self) if f.repr for v in [getattr(self, f.name)]}


HEALTH_COUNTERS = ("respawn_failures", "watchdog_kills", "refused", "expired", "requeued")


class Injector:
    """Injects faults into one server and measures how long it takes to serve at full strength again."""

    def __init__(self, server: torchserve.Server, handler: str, batch: int, tracker: Tracker, rng: random.Random, *,
                 stop_s: float, replace_wait_s: float, log: Callable[[str], None]):
        self.server, self.handler, self.batch, self.tracker, self.rng = server, handler, batch, tracker, rng
        self.stop_s, self.replace_wait_s, self.log = stop_s, replace_wait_s, log
        self.expected_workers = len(tracker.served()[0])
        self.reconfigures = 0
        self._timers: list[threading.Timer] = []
        self._stopped: list[tuple[Fault, psutil.Process]] = []
        self._lock = threading.Lock()

    # -- full strength --

    def status(self, timeout_s: float = STATUS_WAIT_S) -> dict | None:
        """The packrat handler's status; None if stock, unreachable or late (a describe waits 30 s for a gone worker)."""
        if self.handler != "packrat":
            return None
        return bounded(lambda: torchserve.handler_status(self.server), timeout_s)

    def full_strength(self) -> tuple[bool, dict | None]:
        """(Every worker READY and, with the packrat handler, every pool instance ready, the status seen)."""
        statuses = torchserve.worker_status(self.server)
        if len(statuses) < max(1, self.expected_workers) or any(s != "READY" for s in statuses):
            return False, None
        if self.handler != "packrat":
            return True, None
        status = self.status()
        if status is None:
            return False, None
        health = status["health"]
        return health["instances"] > 0 and health["ready"] == health["instances"] and health["respawning"] == 0, status

    def settled(self, fault: Fault) -> bool:
        """The fault's own part of recovery: its processes gone (or resumed), a killed worker succeeded."""
        if fault.kind == "stop":
            return all(reaped(v) for v in fault.victims) or fault.continued_at is not None
        if not all(reaped(v) for v in fault.victims):
            return False
        if fault.kind == "worker":
            return any(w.pid not in fault.pre_pids for w in self.tracker.served()[0])
        return True

    def recovered(self, fault: Fault) -> tuple[bool, dict | None]:
        if not self.settled(fault):
            return False, None
        full, status = self.full_strength()
        switched = fault.target_batch is None or status is None or status["plan"]["batch"] == fault.target_batch
        return full and switched, status

    def wait(self, check: Callable[[], tuple[bool, dict | None]], deadline: float) -> tuple[float | None, dict | None]:
        """Poll check() until `deadline` (unix time): (when it held or None, the last handler status seen)."""
        last = None
        while time.time() < deadline:
            ok, status = check()
            last = status or last
            if ok:
                done = time.time()
                return (done if done <= deadline else None), last
            time.sleep(POLL_S)
        return None, last

    def wait_recovered(self, fault: Fault, deadline: float) -> None:
        """Poll until the server is at full strength after `fault`, or until `deadline` (unix time)."""
        done, last_status = self.wait(lambda: self.recovered(fault), deadline)
        if done is not None:
            fault.recovery_s = done - fault.at
        if fault.kind == "stop" and fault.victims:
            fault.notes.append(f"resumed by SIGCONT after {fault.continued_at - fault.at:.1f} s"
                               if fault.continued_at is not None else
                               "gone before SIGCONT" if reaped(fault.victims[0]) else
                               "still stopped when its window ended")
        self._health_delta(fault, last_status)

    def _health_delta(self, fault: Fault, status: dict | None) -> None:
        if fault.kind == "worker" or fault.health_before is None:
            return  # a new worker starts a new pool: its counters start again
        status = status or self.status()
        if status is None:
            return
        after = status["health"]
        fault.health_delta = {k: after[k] - fault.health_before[k] for k in HEALTH_COUNTERS
                              if k in after and k in fault.health_before}
        if fault.kind == "double-kill" and len(fault.pids) == 2 and "respawn_failures" in fault.health_delta:
            fault.caught_loading = fault.health_delta["respawn_failures"] > 0

    # -- injection --

    def inject(self, n: int, kind: str, t0: float) -> Fault:
        before = self.status(PRE_FAULT_STATUS_WAIT_S)
        now = time.time()
        fault = Fault(n, kind, now, now - t0, health_before=before["health"] if before else None)
        try:
            getattr(self, "_" + kind.replace("-", "_"))(fault)
        except (psutil.Error, OSError, ValueError) as exc:
            fault.notes.append(f"injection failed: {exc}")
        fault.offset_s = fault.at - t0  # the first process hit, after finding it
        return fault

    def _instances(self) -> list[psutil.Process]:
        return self.tracker.served()[1]

    def _victim(self, fault: Fault, candidates: list[psutil.Process], what: str) -> psutil.Process | None:
        if not candidates:
            fault.notes.append(f"no {what} to hit")
            return None
        victim = self.rng.choice(candidates)
        fault.victims.append(victim)
        fault.pids.append(victim.pid)
        return victim

    def _kill(self, fault: Fault) -> None:
        victim = self._victim(fault, self._instances(), "pool instance")
        if victim is not None:
            victim.kill()
            fault.at = time.time()

    def _double_kill(self, fault: Fault) -> None:
        before = {p.pid for p in self._instances()}
        self._kill(fault)
        if not fault.victims:
            return
        deadline = fault.at + self.replace_wait_s
        while time.time() < deadline:
            fresh = [p for p in self._instances() if p.pid not in before]
            if fresh:
                victim = fresh[0]
                try:
                    age = time.time() - victim.create_time()
                    victim.kill()
                except psutil.Error:
                    continue
                fault.victims.append(victim)
                fault.pids.append(victim.pid)
                fault.replacement_age_s = age
                return
            time.sleep(REPLACE_POLL_S)
        fault.notes.append(f"no replacement appeared within {self.replace_wait_s:g} s")

    def _stop(self, fault: Fault) -> None:
        victim = self._victim(fault, self._instances(), "pool instance")
        if victim is None:
            return
        victim.suspend()
        fault.at = time.time()
        timer = threading.Timer(self.stop_s, self._resume, args=(fault, victim))
        timer.daemon = True
        with self._lock:
            self._stopped.append((fault, victim))
            self._timers.append(timer)
        timer.start()

    def _resume(self, fault: Fault, victim: psutil.Process) -> None:
        with self._lock:
            if (fault, victim) not in self._stopped:
                return
            self._stopped.remove((fault, victim))
        try:
            if victim.is_running() and victim.status() != psutil.STATUS_ZOMBIE:
                victim.resume()
                fault.continued_at = time.time()
        except psutil.Error:
            pass  # gone meanwhile: the watchdog (or a later kill) took it

    def _worker(self, fault: Fault) -> None:
        workers = self.tracker.served()[0]
        fault.pre_pids = {w.pid for w in workers}
        victim = self._victim(fault, workers, "TorchServe worker")
        if victim is not None:
            victim.kill()
            fault.at = time.time()

    def _reconfigure(self, fault: Fault) -> None:
        fault.target_batch = reconfigure_target(self.reconfigures, self.batch)
        self.reconfigures += 1
        torchserve_control.request_reconfigure(self.server.control_dir, self.server.model, fault.target_batch)
        fault.at = time.time()
        fault.notes.append(f"to B={fault.target_batch}")

    def close(self) -> None:
        """Resume whatever is still stopped (a stopped process would not even die of SIGTERM)."""
        with self._lock:
            timers, stopped = list(self._timers), list(self._stopped)
        for timer in timers:
            timer.cancel()
        for fault, victim in stopped:
            self._resume(fault, victim)
