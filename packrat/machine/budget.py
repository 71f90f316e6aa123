"""The CPU budget: how many cores a server may plan for, and why.

Three limits, the smallest wins:
  1. affinity: the physical cores in sched_getaffinity (topology.detect());
  2. a CFS quota: floor(quota / period) cores, from the cgroup this process runs in (v2 `cpu.max`, v1
     `cpu.cfs_quota_us` / `cpu.cfs_period_us`), the smallest over the cgroup and its ancestors. This is
     what `docker --cpus` and a Kubernetes `limits.cpu` set: the affinity still shows every host core,
     and a plan for all of them would be throttled;
  3. an explicit request (`--cores`, the archive's `cores`, else the CORES_ENV variable), which
     may lower the budget but never raise it above 1 and 2.

Every path is taken relative to `root` so that tests can build /proc and /sys trees of their own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from packrat.machine.topology import Topology, detect
from packrat.settings import CORES_ENV


@dataclass(frozen=True)
class CpuBudget:
    cores: int
    source: str  # what set the number: "affinity", "cgroup v2 cpu.max", "--cores", ...
    detail: str  # the numbers and where they were read
    topology: Topology  # the cores to pin to, cut to `cores`

    def describe(self) -> str:
        return describe(self.to_json())

    def to_json(self) -> dict:
        return {"cores": self.cores, "source": self.source, "detail": self.detail}


def describe(budget: dict) -> str:
    """One line from CpuBudget.to_json() (as `packrat status` gets it): the cores, then why."""
    cores = budget["cores"]
    return f"{cores} core{'' if cores == 1 else 's'} ({budget['source']}: {budget['detail']})"


@dataclass(frozen=True)
class Quota:
    """A CFS quota: `cores` CPUs' worth of time per period (may be fractional); `detail` says where."""

    cores: float
    source: str
    detail: str


# ---- cgroup discovery -------------------------------------------------------------------------

@dataclass(frozen=True)
class Mount:
    root: str  # the hierarchy path mounted (not "/" inside a container without a cgroup namespace)
    point: Path  # where it is mounted, under the caller's root


def _unescape(field: str) -> str:
    """mountinfo writes spaces, tabs, newlines and backslashes in paths as octal escapes (\\040)."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def cgroup_mounts(root: Path) -> dict[str, Mount]:
    """The cgroup2 mount ("v2") and the v1 mount holding the cpu controller ("v1"), from mountinfo."""
    mounts: dict[str, Mount] = {}
    for line in (_read(root / "proc/self/mountinfo") or "").splitlines():
        fields, _, tail = line.partition(" - ")
        fields, tail = fields.split(), tail.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount = Mount(_unescape(fields[3]), root / _unescape(fields[4]).lstrip("/"))
        if tail[0] == "cgroup2":
            mounts.setdefault("v2", mount)
        elif tail[0] == "cgroup" and "cpu" in tail[2].split(","):
            mounts.setdefault("v1", mount)
    return mounts


def cgroup_paths(root: Path) -> dict[str, str]:
    """This process's cgroup in the v2 hierarchy ("v2") and in the v1 cpu hierarchy ("v1")."""
    paths: dict[str, str] = {}
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            paths["v2"] = path
        elif "cpu" in controllers.split(","):
            paths["v1"] = path
    return paths


def cgroup_dir(mount: Mount, path: str) -> Path:
    """The directory of cgroup `path` under `mount`. Inside a container the path is often "/" or
    one that does not exist under the mount (it names the cgroup in the host's hierarchy, and the
    container sees only its own subtree): then the mount itself is the process's cgroup."""
    relative = os.path.relpath(path, mount.root)
    directory = mount.point / relative
    return mount.point if relative.startswith("..") or not directory.is_dir() else directory


def ancestors(directory: Path, top: Path) -> list[Path]:
    """`directory` and its parents up to `top`, inclusive: a parent's limit also holds for its children."""
    chain = [directory]
    while chain[-1] != top and chain[-1] != chain[-1].parent:
        chain.append(chain[-1].parent)
    return chain


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _number(text: str | None) -> int | None:
    """A positive integer from a cgroup file; None for -1 (no limit), a missing file or garbage."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def v2_quota(directory: Path) -> Quota | None:
    """`cpu.max` is "QUOTA PERIOD" or "max PERIOD" (no limit)."""
    parts = (_read(directory / "cpu.max") or "").split()
    quota, period = (_number(parts[0]), _number(parts[1])) if len(parts) == 2 else (None, None)
    if quota is None or period is None:
        return None
    return Quota(quota / period, "cgroup v2 cpu.max", f"cpu.max {quota} {period} at {directory}")


def v1_quota(directory: Path) -> Quota | None:
    """`cpu.cfs_quota_us` is -1 when there is no limit."""
    quota, period = _number(_read(directory / "cpu.cfs_quota_us")), _number(_read(directory / "cpu.cfs_period_us"))
    if quota is None or period is None:  # -1: no limit
        return None
    return Quota(quota / period, "cgroup v1 cpu.cfs_quota_us",
                 f"cpu.cfs_quota_us {quota} / cpu.cfs_period_us {period} at {directory}")


def cgroup_quota(root: Path = Path("/")) -> Quota | None:
    """The tightest CFS quota over this process's cgroup and its ancestors, in either hierarchy (a
    hybrid host mounts both; only one holds the cpu controller); None when there is none."""
    mounts, paths = cgroup_mounts(root), cgroup_paths(root)
    readers = {"v2": v2_quota, "v1": v1_quota}
    found = []
    for version, read in readers.items():
        if version in mounts and version in paths:
            mount = mounts[version]
            found += [read(d) for d in ancestors(cgroup_dir(mount, paths[version]), mount.point)]
    return min((q for q in found if q is not None), key=lambda q: q.cores, default=None)


# ---- the budget -------------------------------------------------------------------------------

def parse_cores(value, what: str) -> int:
    """A core count of at least 1, or a ValueError naming where it came from."""
    try:
        cores = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{what} must be a whole number of cores, got {value!r}") from None
    if cores < 1:
        raise ValueError(f"{what} must be at least 1 core, got {cores}")
    return cores


def machine_budget(topology: Topology, root: Path) -> CpuBudget:
    """What the machine gives: the affinity's cores, cut by a CFS quota."""
    affinity = topology.num_cores
    budget = CpuBudget(affinity, "affinity", f"{affinity} physical cores in the CPU affinity", topology)
    quota = cgroup_quota(root)
    if quota is None or quota.cores >= affinity:
        return budget
    cores = max(1, int(quota.cores))
    note = " (a quota below one core: planned as 1 core, which is throttled)" if quota.cores < 1 else ""
    return CpuBudget(cores, quota.source, f"{quota.detail} → {cores} of {affinity} cores{note}",
                     topology.limited(cores))


def cpu_budget(requested=None, requested_by: str = "--cores", *, topology: Topology | None = None,
               root: Path = Path("/"), env=os.environ) -> CpuBudget:
    """The cores this process may plan for: the machine's budget, lowered to `requested` (or, when
    that is None, to CORES_ENV) if given. A request above what the machine gives is cut to it."""
    budget = machine_budget(topology or detect(), Path(root))
    if requested is None and env.get(CORES_ENV.name):
        requested, requested_by = env[CORES_ENV.name], CORES_ENV.name
    if requested is None:
        return budget
    wanted = parse_cores(requested, requested_by)
    if wanted > budget.cores:
        return CpuBudget(budget.cores, budget.source, f"{requested_by} asked for {wanted} cores, more than "
                         f"this machine gives: {budget.detail}", budget.topology)
    return CpuBudget(wanted, requested_by, f"{wanted} of the {budget.cores} cores allowed ({budget.source})",
                     budget.topology.limited(wanted))
