"""What a server's processes hold and spend: the pool's /dev/shm segments, its tree's PSS, open files and
segments over time, and its CPU time split between the front end, the instances and the rest."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from packrat.bench.harness import Periodic, log
from packrat.bench.results import fmt_num, ratio

MIB = 2 ** 20
SHM_DIR = Path("/dev/shm")
# multiprocessing.shared_memory's random names (the pool's before issue 16) and the pool's own
# packrat-<owner pid>-<n>.
SHM_PREFIXES = ("psm_", "packrat-")
CPU_PARTS = ("front_end", "instances")


# ---- shared memory -------------------------------------------------------------------------------

def segment_owner(name: str) -> int | None:
    """The owner pid in a pool segment name packrat-<pid>-<n>; None for any other name."""
    import re

    match = re.fullmatch(r"packrat-(\d+)-.*", name)
    return int(match[1]) if match else None


def shm_segments(prefixes: Sequence[str] = SHM_PREFIXES) -> set[str]:
    try:
        return {p.name for p in SHM_DIR.iterdir() if p.name.startswith(tuple(prefixes))}
    except OSError:
        return set()


def mapped_segments(pids: Iterable[int], prefixes: Sequence[str] = SHM_PREFIXES) -> set[str]:
    """/dev/shm segments named like the pool's that these processes have mapped (/proc/PID/maps)."""
    found = set()
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            path = line.split(maxsplit=5)[5:]
            if path and path[0].startswith(str(SHM_DIR) + "/"):
                name = path[0][len(str(SHM_DIR)) + 1:].removesuffix(" (deleted)")
                if name.startswith(tuple(prefixes)):
                    found.add(name)
    return found


def owned_segments(pids: Iterable[int]) -> set[str]:
    """The pool segments these processes map or own (by name)."""
    pids = set(pids)
    return mapped_segments(pids) | {name for name in shm_segments() if segment_owner(name) in pids}


# ---- a process tree over time --------------------------------------------------------------------

def tree_sample(root_pid: int | None, seen: set[int]) -> dict:
    """The server's tree now: PSS (MiB), open files, the /dev/shm MiB it maps or owns (`seen` grows); None
    figures when the root is gone."""
    import psutil

    try:
        root = psutil.Process(root_pid) if root_pid is not None else None
        tree = [root, *root.children(recursive=True)] if root is not None else []
    except psutil.Error:
        tree = []
    pss = fds = 0
    live = []
    for proc in tree:
        try:
            pss += proc.memory_full_info().pss
            fds += proc.num_fds()
            live.append(proc.pid)
        except psutil.Error:
            continue
    seen.update(live)
    names = mapped_segments(live) | {name for name in shm_segments() if segment_owner(name) in seen}
    size = 0
    for name in names:
        try:
            size += (SHM_DIR / name).stat().st_size
        except OSError:  # unlinked meanwhile (still mapped: its pages are in the PSS)
            continue
    found = bool(live)
    return {"time": time.time(), "pss_mib": pss / MIB if found else None, "fds": fds if found else None,
            "shm_mib": size / MIB if found else None, "segments": len(names), "processes": len(live)}


class TreeSampler(Periodic):
    """While active, a tree_sample every every_s seconds from a thread (and the first at once)."""

    def __init__(self, root_pid: Callable[[], int | None], every_s: float):
        super().__init__(every_s, "soak sampler", self.take, at_once=True)
        self.root_pid = root_pid
        self.samples: list[dict] = []
        self.seen: set[int] = set()

    def take(self) -> dict:
        sample = tree_sample(self.root_pid(), self.seen)
        self.samples.append(sample)
        log(f"sample: PSS {fmt_num(sample['pss_mib'], 0)} MiB, {fmt_num(sample['fds'], 0)} open files, "
            f"/dev/shm {fmt_num(sample['shm_mib'], 2)} MiB in {sample['segments']} segment(s), "
            f"{sample['processes']} processes")
        return sample


# ---- CPU -----------------------------------------------------------------------------------------

def server_cpu(run_dir: Path) -> dict[str, float]:
    """CPU seconds so far of the server in run_dir: its front end (KServe's process, or TorchServe's Java and
    worker) and its instances, processes or threads named THREAD_NAME... (an ended thread counts as the front end's)."""
    import psutil

    from packrat.bench.faults import POOL_MARKER, torchserve_pid
    from packrat.machine.threads import task_cpu
    from packrat.serving.pool.thread_instance import THREAD_NAME

    roots = {p.pid for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])}
    roots |= {pid for pid in (torchserve_pid(run_dir),) if pid is not None}
    seen: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            seen.update((p.pid, p) for p in [root, *root.children(recursive=True)])
        except psutil.Error:
            continue
    totals = dict.fromkeys(CPU_PARTS, 0.0)
    for proc in seen.values():
        try:
            times, part = proc.cpu_times(), "instances" if POOL_MARKER in " ".join(proc.cmdline()) else "front_end"
            threads = sum(cpu for name, cpu in task_cpu(proc.pid).values()
                          if name.startswith(THREAD_NAME)) if part == "front_end" else 0.0
        except (psutil.Error, OSError):
            continue
        totals[part] += times.user + times.system - threads
        totals["instances"] += threads
    machine = psutil.cpu_times()
    totals["machine"] = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
    return totals


def cpu_delta(start: Mapping, end: Mapping) -> dict[str, float]:
    return {part: end.get(part, 0.0) - start.get(part, 0.0) for part in (*CPU_PARTS, "machine")}


def refusal_cost(cpu_before: Mapping, cpu_over: Mapping, before: Sequence[Mapping], over: Mapping,
                 duration_s: float | None = None) -> dict:
    """CPU ms per answer 200 before and during the overload (front end, instances), per 503 during it (the
    front end's time beyond its 200s' earlier cost), and the cores the rest of the machine took."""
    ok_before = sum(run["by_status"].get("200", 0) for run in before)
    ok_over, refused = over["counts"]["200"], over["counts"]["503"]
    per_200 = {part: ratio(cpu_before.get(part, 0.0) * 1e3, ok_before) for part in CPU_PARTS}
    during = {part: ratio(cpu_over.get(part, 0.0) * 1e3, ok_over) for part in CPU_PARTS}
    front = per_200["front_end"]
    per_refusal = (ratio(cpu_over.get("front_end", 0.0) * 1e3 - front * ok_over, refused)
                   if front is not None and refused else None)
    others = cpu_over.get("machine", 0.0) - sum(cpu_over.get(part, 0.0) for part in CPU_PARTS)
    return {"cpu_s_before": dict(cpu_before), "cpu_s_overload": dict(cpu_over), "ms_per_200_before": per_200,
            "ms_per_200_overload": during, "front_end_ms_per_503": per_refusal,
            "others_cores_overload": others / duration_s if duration_s else None}


def cost_line(cost: Mapping) -> str:
    before, during = cost["ms_per_200_before"], cost["ms_per_200_overload"]
    refusal = cost["front_end_ms_per_503"]
    others = cost.get("others_cores_overload")
    return (f"CPU per answer 200, before / during the overload: instances {fmt_num(before['instances'])} / "
            f"{fmt_num(during['instances'])} ms, front end {fmt_num(before['front_end'])} / "
            f"{fmt_num(during['front_end'])} ms; a refusal cost the front end about "
            f"{fmt_num(refusal, 2) if refusal is not None else '?'} ms"
            + (f"; the rest of the machine (client, neighbours) took {others:.2f} cores" if others is not None else ""))
