"""CPU topology: which physical cores this process may use, grouped by socket.

Instances are pinned to physical cores (one logical CPU per core: hyper-threading
siblings share execution units, so counting them as cores would overstate T).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path


def cpuinfo(field: str) -> str | None:
    """The first /proc/cpuinfo value of `field` ("model name", "flags"), or None where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None

SYSFS_CPU = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class Topology:
    """Physical cores (as logical CPU ids usable with sched_setaffinity) per socket."""

    sockets: tuple[tuple[int, ...], ...]

    @property
    def cores(self) -> list[int]:
        return [cpu for socket in self.sockets for cpu in socket]

    @property
    def num_cores(self) -> int:
        return sum(len(socket) for socket in self.sockets)

    @classmethod
    def virtual(cls, num_cores: int, sockets: int = 1) -> "Topology":
        """A made-up machine, for plans computed from another machine's profile."""
        per_socket, extra = divmod(num_cores, sockets)
        layout, start = [], 0
        for s in range(sockets):
            size = per_socket + (1 if s < extra else 0)
            layout.append(tuple(range(start, start + size)))
            start += size
        return cls(tuple(s for s in layout if s))

    def limited(self, cores: int) -> "Topology":
        """At most `cores` of these cores, for a budget below the machine's: the largest sockets
        first, whole, so that instances which fit in one socket still find one, then part of the
        next."""
        left, kept = cores, {}
        for index in sorted(range(len(self.sockets)), key=lambda i: -len(self.sockets[i])):
            kept[index], left = self.sockets[index][:left], left - min(left, len(self.sockets[index]))
        return Topology(tuple(kept[i] for i in range(len(self.sockets)) if kept[i]))

    def cores_for(self, threads: int) -> list[int]:
        """`threads` cores for one instance: within one socket when one is big enough."""
        if threads > self.num_cores:
            raise ValueError(f"{threads} threads asked for but only {self.num_cores} cores are usable")
        for socket in sorted(self.sockets, key=len, reverse=True):
            if len(socket) >= threads:
                return list(socket[:threads])
        return self.cores[:threads]

    def assign(self, thread_counts: list[int]) -> list[list[int]]:
        """Disjoint, contiguous core sets, one per instance, in the order given.

        Largest instances are placed first (first-fit decreasing over sockets) so
        an instance only spans sockets when no socket has room for it.
        """
        if sum(thread_counts) > self.num_cores:
            raise ValueError(f"{sum(thread_counts)} threads do not fit on {self.num_cores} cores")
        free = [list(socket) for socket in self.sockets]
        result: list[list[int]] = [[] for _ in thread_counts]
        order = sorted(range(len(thread_counts)), key=lambda i: -thread_counts[i])
        for i in order:
            need = thread_counts[i]
            socket = next((s for s in free if len(s) >= need), None)
            if socket is not None:
                result[i], socket[:] = socket[:need], socket[need:]
                continue
            for socket in sorted(free, key=len, reverse=True):  # spill across sockets
                take = min(need, len(socket))
                result[i] += socket[:take]
                socket[:] = socket[take:]
                need -= take
        return result


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def detect(allowed: set[int] | None = None) -> Topology:
    """The physical cores this process may run on, grouped by socket."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else set(allowed)
    by_socket: dict[int, dict[int, int]] = {}
    for cpu in sorted(allowed):
        topo = SYSFS_CPU / f"cpu{cpu}" / "topology"
        socket = _read_int(topo / "physical_package_id")
        core = _read_int(topo / "core_id")
        if socket is None or core is None:  # no sysfs (containers): one socket, no siblings
            socket, core = 0, cpu
        by_socket.setdefault(socket, {}).setdefault(core, cpu)  # first sibling stands for the core
    sockets = tuple(tuple(sorted(cores.values())) for _, cores in sorted(by_socket.items()))
    return Topology(sockets)


def logical_cpus(cores, allowed: set[int] | None = None) -> list[int]:
    """The CPU ids of physical `cores` (as Topology names them: each core's first sibling) with their
    SMT siblings among `allowed` (default: this process's affinity), to pin a process to whole cores."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else set(allowed)
    wanted = set(cores)

    def physical(cpu: int) -> tuple:
        topo = SYSFS_CPU / f"cpu{cpu}" / "topology"
        return _read_int(topo / "physical_package_id"), _read_int(topo / "core_id")

    keys = {physical(cpu) for cpu in wanted}
    return sorted(wanted | {cpu for cpu in allowed if None not in physical(cpu) and physical(cpu) in keys})


def cpu_model() -> str:
    """The CPU's model name, as a profile records it (the machine type profiles are chosen by)."""
    return cpuinfo("model name") or platform.processor() or "unknown"
