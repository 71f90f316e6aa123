"""The CPU budget: affinity, cut to a cgroup's CFS quota (v1 and v2, nested, inside containers), cut to
an explicit request; read from fixture /proc and /sys trees, and once under a real v1 quota."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from packrat.machine.budget import cgroup_quota, cpu_budget
from packrat.machine.topology import Topology
from packrat.settings import CORES_ENV

SIXTEEN = Topology.virtual(16)
V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate"
V1_MOUNT = "32 31 0:29 {root} /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct"
V1_OTHER = "33 31 0:30 / /sys/fs/cgroup/memory rw,nosuid shared:10 - cgroup cgroup rw,memory"
HYBRID_V2 = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw"


def machine(tmp_path: Path, cgroup: str, mountinfo: list[str], files: dict[str, str]) -> Path:
    """A root holding proc/self/{cgroup,mountinfo} and the given cgroup files (paths from the root)."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    (tmp_path / "proc/self/mountinfo").write_text("\n".join(mountinfo) + "\n")
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text + "\n")
    return tmp_path


def budget(root: Path, requested=None, requested_by="--cores", env=None):
    return cpu_budget(requested, requested_by, topology=SIXTEEN, root=root, env=env or {})


def v2(tmp_path, files: dict[str, str], path: str = "/kubepods/pod1") -> Path:
    return machine(tmp_path, f"0::{path}\n", [V2_MOUNT], files)


def v1(tmp_path, files: dict[str, str], path: str = "/kubepods/pod1", mount_root: str = "/") -> Path:
    cgroup = f"5:memory:{path}\n4:cpu,cpuacct:{path}\n0::/\n"
    return machine(tmp_path, cgroup, [V1_MOUNT.format(root=mount_root), V1_OTHER], files)


def test_no_cgroup_at_all_means_the_affinity(tmp_path):
    found = budget(tmp_path)
    assert (found.cores, found.source, found.topology) == (16, "affinity", SIXTEEN)
    assert found.detail == "16 physical cores in the CPU affinity"
    assert found.to_json() == {"cores": 16, "source": "affinity", "detail": found.detail}


def test_v2_cpu_max_cuts_the_affinity(tmp_path):
    root = v2(tmp_path, {"sys/fs/cgroup/kubepods/pod1/cpu.max": "400000 100000"})
    found = budget(root)
    assert (found.cores, found.source) == (4, "cgroup v2 cpu.max")
    assert found.detail == f"cpu.max 400000 100000 at {root}/sys/fs/cgroup/kubepods/pod1 → 4 of 16 cores"
    assert found.topology.cores == [0, 1, 2, 3]
    assert found.describe().startswith("4 cores (cgroup v2 cpu.max: cpu.max 400000 100000 at ")


def test_v2_max_is_no_limit(tmp_path):
    root = v2(tmp_path, {"sys/fs/cgroup/kubepods/pod1/cpu.max": "max 100000"})
    assert (budget(root).cores, budget(root).source) == (16, "affinity")


def test_a_quota_above_the_affinity_changes_nothing(tmp_path):
    root = v2(tmp_path, {"sys/fs/cgroup/kubepods/pod1/cpu.max": "3200000 100000"})
    assert (budget(root).cores, budget(root).source) == (16, "affinity")


def test_the_tightest_ancestor_wins_and_fractions_round_down(tmp_path):
    root = v2(tmp_path, {"sys/fs/cgroup/kubepods/cpu.max": "350000 100000",
                         "sys/fs/cgroup/kubepods/pod1/cpu.max": "800000 100000",
                         "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max": "max 100000"}, path="/kubepods/pod1/ctr")
    found = budget(root)
    assert found.cores == 3 and f"at {root}/sys/fs/cgroup/kubepods → 3 of 16" in found.detail


def test_a_quota_below_one_core_gives_one_with_a_note(tmp_path):
    root = v2(tmp_path, {"sys/fs/cgroup/kubepods/pod1/cpu.max": "50000 100000"})
    found = budget(root)
    assert found.cores == 1 and "below one core" in found.detail and found.topology.num_cores == 1


def test_v1_quota_and_period(tmp_path):
    root = v1(tmp_path, {"sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us": "250000",
                         "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_period_us": "100000",
                         "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1",
                         "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000"})
    found = budget(root)
    assert (found.cores, found.source) == (2, "cgroup v1 cpu.cfs_quota_us")
    assert "cpu.cfs_quota_us 250000 / cpu.cfs_period_us 100000 at " in found.detail


def test_v1_minus_one_is_no_limit_and_a_parent_limit_holds(tmp_path):
    root = v1(tmp_path, {"sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us": "-1",
                         "sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_period_us": "100000",
                         "sys/fs/cgroup/cpu,cpuacct/kubepods/cpu.cfs_quota_us": "600000",
                         "sys/fs/cgroup/cpu,cpuacct/kubepods/cpu.cfs_period_us": "100000"})
    assert budget(root).cores == 6
    (root / "sys/fs/cgroup/cpu,cpuacct/kubepods/cpu.cfs_quota_us").write_text("-1\n")
    assert (budget(root).cores, budget(root).source) == (16, "affinity")


def test_hybrid_host_reads_the_v1_cpu_controller(tmp_path):
    """cgroup2 mounted beside v1 (as on this machine) holds no cpu.max: the v1 cpu hierarchy has the quota."""
    root = machine(tmp_path, "2:cpuacct:/\n1:cpu:/job\n0::/\n",
                   [HYBRID_V2, "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu"],
                   {"sys/fs/cgroup/cpu/job/cpu.cfs_quota_us": "200000",
                    "sys/fs/cgroup/cpu/job/cpu.cfs_period_us": "100000"})
    assert (budget(root).cores, budget(root).source) == (2, "cgroup v1 cpu.cfs_quota_us")


def test_container_with_a_cgroup_namespace_reads_the_mount_itself(tmp_path):
    """docker --cpus 2 on cgroup v2: /proc/self/cgroup says "/", the container's cgroup is mounted at /sys/fs/cgroup."""
    root = v2(tmp_path, {"sys/fs/cgroup/cpu.max": "200000 100000"}, path="/")
    assert budget(root).cores == 2


def test_container_path_missing_under_the_mount_reads_the_mount_itself(tmp_path):
    """The path names the cgroup in the host's hierarchy, which the container does not see."""
    root = v2(tmp_path, {"sys/fs/cgroup/cpu.max": "300000 100000"}, path="/kubepods/burstable/pod9/ctr")
    assert budget(root).cores == 3


def test_v1_container_without_a_namespace_maps_the_path_through_the_mount_root(tmp_path):
    """v1 docker: /proc/self/cgroup names /docker/abc, which is the mount's root (mountinfo field 4)."""
    root = v1(tmp_path, {"sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "150000",
                         "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000"},
              path="/docker/abc", mount_root="/docker/abc")
    quota = cgroup_quota(root)
    assert quota.cores == 1.5 and quota.detail.endswith(f"at {root}/sys/fs/cgroup/cpu,cpuacct")
    assert budget(root).cores == 1


def test_a_request_below_the_budget_is_kept(tmp_path):
    root = v2(tmp_path, {"sys/fs/cgroup/kubepods/pod1/cpu.max": "400000 100000"})
    found = budget(root, 2, "--cores")
    assert (found.cores, found.source) == (2, "--cores")
    assert found.detail == "2 of the 4 cores allowed (cgroup v2 cpu.max)" and found.topology.cores == [0, 1]


def test_a_request_above_the_quota_is_cut_and_says_why(tmp_path):
    root = v2(tmp_path, {"sys/fs/cgroup/kubepods/pod1/cpu.max": "400000 100000"})
    found = budget(root, 8, "archive cores")
    assert (found.cores, found.source) == (4, "cgroup v2 cpu.max")
    assert found.detail.startswith("archive cores asked for 8 cores, more than this machine gives: cpu.max 400000")
    assert budget(tmp_path / "no-cgroup", 32).cores == 16  # and above the affinity


def test_packrat_cores_applies_only_without_a_request(tmp_path):
    found = budget(tmp_path, env={CORES_ENV.name: "3"})
    assert (found.cores, found.source) == (3, CORES_ENV.name)
    assert budget(tmp_path, 5, env={CORES_ENV.name: "3"}).cores == 5


@pytest.mark.parametrize("value", ["0", "-2", "four", "1.5"])
def test_a_bad_request_names_where_it_came_from(tmp_path, value):
    with pytest.raises(ValueError, match=f"{CORES_ENV} must be"):
        budget(tmp_path, env={CORES_ENV.name: value})


def test_garbage_in_cgroup_files_is_no_limit(tmp_path):
    root = v2(tmp_path, {"sys/fs/cgroup/kubepods/pod1/cpu.max": "lots 100000"})
    assert budget(root).cores == 16


def test_limited_keeps_whole_sockets_largest_first():
    two = Topology(((0, 1, 2, 3), (4, 5, 6, 7, 8, 9, 10, 11)))
    assert two.limited(6).sockets == ((4, 5, 6, 7, 8, 9),)  # one socket holds it
    assert two.limited(10).sockets == ((0, 1), (4, 5, 6, 7, 8, 9, 10, 11))
    assert two.limited(12) == two and two.limited(40) == two
    assert Topology.virtual(16, sockets=2).limited(8).sockets == ((0, 1, 2, 3, 4, 5, 6, 7),)


# ---- a real CFS quota (cgroup v1, as on this machine) --------------------------------------------

V1_CPU = Path("/sys/fs/cgroup/cpu")
CHILD = "import json, sys; sys.stdin.readline(); from packrat.machine.budget import cpu_budget; " \
        "print(json.dumps(cpu_budget().to_json()))"


def real_v1_cgroup() -> Path:
    """A fresh cgroup under the v1 cpu controller, or skip saying why there can be none."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a cgroup")
    if not (V1_CPU / "cpu.cfs_quota_us").exists() or not os.access(V1_CPU, os.W_OK):
        pytest.skip(f"no writable cgroup v1 cpu controller at {V1_CPU}")
    group = V1_CPU / f"packrat-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create {group}: {exc}")
    return group


def test_a_real_v1_quota_of_one_core():
    group = real_v1_cgroup()
    env = {k: v for k, v in os.environ.items() if k != CORES_ENV.name}
    child = None
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("100000")
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True, env=env, cwd=Path(__file__).resolve().parents[1])
        (group / "tasks").write_text(str(child.pid))  # moved in before it reads its budget
        out, _ = child.communicate("go\n", timeout=60)
        found = json.loads(out.strip().splitlines()[-1])
        assert (found["cores"], found["source"]) == (1, "cgroup v1 cpu.cfs_quota_us")
        assert f"cpu.cfs_quota_us 100000 / cpu.cfs_period_us 100000 at {group}" in found["detail"]
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        group.rmdir()  # empty once the child has exited
