"""The profiler: real pinned measurements of the tiny model, alone and loaded by copies of itself, resume,
Ctrl-C."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packrat.profiling import measuring, profiler
from packrat.errors import ProfilingError
from packrat.profiling.point import summarize
from packrat.profiling.profiles import COLUMNS, load
from packrat.errors import ProfileError
from packrat.machine.topology import Topology, detect

FAST = profiler.ProfileSettings(model="tiny", warmup=1, iters=5)
ISOLATED = dataclasses.replace(FAST, contention=False)
# Real points whose claim is pinning, threads, copies or Ctrl-C, not a graph mode, run eager: nothing
# is compiled for them (an AOTInductor package of tiny at 1 thread costs 10-30 s to build on 2 cores).
# The default mode's real point is test_one_copy_fits_so_the_point_is_measured_once, at ⟨2 threads,
# batch 1⟩, a package the compile tests of test_models.py build anyway.
EAGER = dataclasses.replace(FAST, graph_mode="eager")


def two_cores() -> Topology:
    """Two of this machine's cores as a one-socket topology: room for two 1-thread copies."""
    cores = detect().cores
    if len(cores) < 2:
        pytest.skip("needs two cores")
    return Topology((tuple(cores[:2]),))


@pytest.fixture
def started(monkeypatch) -> list:
    """Every loaded copy the profiler starts, to check none is left running."""
    copies = []

    class Recorded(measuring._Copy):
        def __init__(self, *args):
            super().__init__(*args)
            copies.append(self)

    monkeypatch.setattr(measuring, "_Copy", Recorded)
    return copies


def fake_stats(latency: float) -> dict:
    return {"latency_ms": latency, "p50_ms": 1.0, "p99_ms": 2.0, "std_ms": 0.1, "iterations": 3}


def amdahl(t: int, b: int) -> float:
    """A model whose serial part is a fifth of the work: scaling flattens, so the grid can be cut."""
    return 10.0 * b * (0.2 + 0.8 / t)


class FakeWorkers:
    """measuring.Workers without processes: each batch's row from amdahl(), started counted."""
    started: list = []
    calls: list = []

    def __init__(self, settings, threads, topology):
        self.runtime, self.threads, self.load_s, self.measure_s = settings.runtime, threads, 0.5, 0.0
        FakeWorkers.started.append((settings.runtime, threads))

    def measure(self, batch):
        FakeWorkers.calls.append((self.runtime, self.threads, batch))
        self.measure_s += 0.25
        ms = amdahl(self.threads, batch) * (1.3 if self.runtime == "slow" else 1.0)
        return {"threads": self.threads, "batch": batch, "runtime": self.runtime, **fake_stats(ms),
                "isolated_ms": ms, "copies": 1}

    def close(self):
        pass


@pytest.fixture
def fake_workers(monkeypatch):
    FakeWorkers.started, FakeWorkers.calls = [], []
    monkeypatch.setattr(profiler, "Workers", FakeWorkers)
    monkeypatch.setattr(profiler, "LIVE_COPIES_PER_CORE", 100)
    monkeypatch.setattr(profiler, "_build", lambda *args: [])
    monkeypatch.setattr(profiler, "check_runtimes", lambda settings, runtimes, say, account=None:
                        {r: None for r in runtimes})
    return FakeWorkers




@pytest.mark.integration
def test_one_real_point_runs_pinned_with_its_threads():
    core = detect().cores[-1]
    stats = measuring.measure_point(EAGER, 1, 2, [core])
    assert stats["cores"] == [core]
    assert stats["torch_threads"] == 1
    assert stats["mode"] == "eager"  # the mode asked for, as the point ran it
    assert stats["iterations"] == 5
    assert 0 < stats["p50_ms"] <= stats["p99_ms"]


@pytest.mark.integration
def test_failed_point_names_the_point():
    with pytest.raises(ProfilingError, match="threads=1 batch=1 failed: .*unknown model"):
        measuring.measure_point(profiler.ProfileSettings(model="no_such_model", iters=1), 1, 1, [0])


def test_summary_statistics():
    stats = summarize([4.0, 1.0, 3.0, 2.0])
    assert stats["latency_ms"] == 2.5 and stats["p50_ms"] == 2.5 and stats["p99_ms"] == 4.0
    assert stats["iterations"] == 4


def test_run_writes_metadata_and_resumes(tmp_path, fake_workers):
    out = tmp_path / "tiny.csv"
    topo = Topology(((0, 1, 2, 3),))
    profiler.run(ISOLATED, [1, 2], [1, 2], out, topology=topo, progress=False)
    assert sorted(fake_workers.calls) == [("inductor", t, b) for t in (1, 2) for b in (1, 2)]
    fake_workers.calls.clear()
    profile = profiler.run(ISOLATED, [1, 2, 4], [1, 2], out, topology=topo, progress=False)
    assert sorted(fake_workers.calls) == [("inductor", 4, 1), ("inductor", 4, 2)]  # only the missing points
    assert len(profile.latency) == 6
    assert profile.metadata["model"] == "tiny" and profile.metadata["cores"] == "4"
    assert profile.metadata["latency"] == "isolated" and not profile.loaded
    assert {"mode", "torch", "cpu", "date"} <= set(profile.metadata)
    assert {row["copies"] for row in profile.rows} == {"1"} and profile.isolated == profile.latency


class FakeCopy:
    """A `point --loaded` copy without a process: says ready, and ready again for each `batch N`."""

    def __init__(self, cmd, env):
        self.threads = int(cmd[cmd.index("--threads") + 1])
        self.cores = [int(core) for core in cmd[cmd.index("--cores") + 1].split(",")]
        self.lines, self.batch = ["ready {}"], None

    def send_run(self, command="run"):
        assert command.startswith("batch "), "rounds are fake_round's"
        self.batch = int(command.split()[1])
        self.lines.append("ready " + json.dumps({"mode": "eager", "cores": self.cores, "torch_threads": self.threads}))

    def expect(self, deadline, what, is_it):
        return self.lines.pop(0)

    def close_input(self):
        pass

    def stop(self, grace):
        pass


@pytest.mark.parametrize("isolated_too", [False, True])
def test_contention_measures_each_point_as_it_is_served(tmp_path, monkeypatch, isolated_too):
    """Loaded beside ⌊T/t⌋ - 1 copies where they fit, alone where they do not; alone as well only
    when asked (isolated_too: the oracle's two figures)."""
    alone, loaded = set(), set()

    def fake_round(copies, timeout, command="run"):  # a lockstep round: 12 b / t ms alone, 18 b / t loaded
        t, b = copies[0].threads, copies[0].batch
        (loaded if len(copies) > 1 else alone).add((t, b, tuple(tuple(copy.cores) for copy in copies)))
        return (18.0 if len(copies) > 1 else 12.0) * b / t, [[12.0 * b / t]] * len(copies)

    monkeypatch.setattr(measuring, "_Copy", FakeCopy)
    monkeypatch.setattr(measuring, "_round", fake_round)
    out = tmp_path / "tiny.csv"
    topo = Topology(((0, 1, 2, 3),))
    assert profiler.DEFAULT_CONTENTION == FAST.contention
    settings = dataclasses.replace(FAST, contention=True, isolated_too=isolated_too, served=False)
    with profiler.profiles.ProfileWriter(out, profiler.metadata(settings, topo)) as writer:
        for t in (1, 2, 3, 4):
            writer.write(measuring.measure(settings, t, 2, topo))
    profile = load(out)
    assert sorted(alone) == ([(1, 2, ((0,),)), (2, 2, ((0, 1),))] if isolated_too else []) + [
        (3, 2, ((0, 1, 2),)), (4, 2, ((0, 1, 2, 3),))]
    assert sorted(loaded) == [(1, 2, ((0,), (1,), (2,), (3,))), (2, 2, ((0, 1), (2, 3)))]  # ⌊4/t⌋ > 1 copies only
    assert profile.loaded and profile.metadata["latency"] == "loaded"
    assert profile.latency == {(1, 2): 36.0, (2, 2): 18.0, (3, 2): 8.0, (4, 2): 6.0}
    assert profile.isolated == ({(1, 2): 24.0, (2, 2): 12.0} if isolated_too else {}) | {(3, 2): 8.0, (4, 2): 6.0}
    assert {row["threads"]: row["copies"] for row in profile.rows} == {"1": "4", "2": "2", "3": "1", "4": "1"}
    assert profile.figures == (("loaded", "isolated") if isolated_too else ("loaded",))
    if not isolated_too:
        with pytest.raises(ProfileError, match="only for the points served alone"):
            profile.items("isolated")


@pytest.mark.parametrize("first,then,flag", [(True, False, "--contention"), (False, True, "--isolated")])
def test_resume_refuses_the_other_kind(tmp_path, fake_workers, first, then, flag):
    out = tmp_path / "tiny.csv"
    topo = Topology(((0,),))  # one core: no copies, so nothing real runs
    profiler.run(dataclasses.replace(FAST, contention=first), [1], [1], out, topology=topo, progress=False)
    with pytest.raises(ProfileError, match=f"latency '{'loaded' if first else 'isolated'}', not "
                                           f"'{'loaded' if then else 'isolated'}'; choose another --out "
                                           f"\\(or resume it with {flag}\\)"):
        profiler.run(dataclasses.replace(FAST, contention=then), [1], [2], out, topology=topo, progress=False)


def test_older_isolated_profile_refuses_loaded_points(tmp_path, monkeypatch):
    out = tmp_path / "tiny.csv"
    out.write_text("# model: tiny\n# mode: compile\nthreads,batch,latency_ms,p50_ms,p99_ms,std_ms,iterations\n"
                   "1,1,3,3,3,0,5\n")
    with pytest.raises(ProfileError, match="latency 'isolated', not 'loaded'"):
        profiler.run(dataclasses.replace(FAST, contention=True), [1], [2], out, topology=Topology(((0,),)),
                     progress=False)


@pytest.mark.integration
def test_loaded_point_runs_copies_on_disjoint_pinned_cores(started):
    topo = two_cores()
    row = measuring.measure(dataclasses.replace(EAGER, contention=True, isolated_too=True), 1, 2, topo)
    assert row["threads"] == 1 and row["batch"] == 2 and row["copies"] == 2
    assert sorted(map(tuple, row["copy_cores"])) == [(c,) for c in topo.cores]  # each copy on its own core
    assert row["iterations"] == FAST.iters  # lockstep rounds, each as slow as the slowest copy
    assert row["latency_ms"] >= row["copy_ms"] > 0
    assert row["latency_ms"] > 0 and row["isolated_ms"] > 0 and row["mode"] == "eager"
    assert set(COLUMNS) <= set(row)
    assert len(started) == 2 and all(copy.proc.returncode == 0 for copy in started)  # stopped by closing stdin


@pytest.mark.integration
def test_one_copy_fits_so_the_point_is_measured_once(started):
    row = measuring.measure(dataclasses.replace(FAST, contention=True), 2, 1, two_cores())
    assert len(started) == 1  # no room for a second copy
    assert row["copies"] == 1 and row["latency_ms"] == row["isolated_ms"]
    assert row["mode"] == "compile" and row["torch_threads"] == 2  # the default mode, at the point's threads


@pytest.mark.parametrize("settings,timeout,reason", [
    (profiler.ProfileSettings(model="no_such_model", iters=1), 60.0,
     r"measuring threads=1 batch=1 under load \(2 copies\) failed: .*unknown model"),
    (FAST, 0.01, r"starting 2 measuring copies of threads=1 failed: a copy was not ready within 0.01 s"),
])
@pytest.mark.integration
def test_failed_loaded_point_names_it_and_leaves_no_copy(started, settings, timeout, reason):
    with pytest.raises(ProfilingError, match=reason):
        with measuring.Workers(settings, 1, two_cores(), timeout) as workers:
            workers.measure(1)
    assert len(started) == 2 and all(copy.proc.returncode is not None for copy in started)


@pytest.mark.integration
def test_loaded_copy_runs_once_per_run_line_until_stdin_closes():
    core = detect().cores[-1]
    cmd = [sys.executable, "-m", "packrat.profiling.point", "--model", "tiny", "--threads", "1", "--batch", "1",
           "--cores", str(core), "--warmup", "1", "--graph-mode", "eager", "--loaded"]
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        word, _, actual = proc.stdout.readline().partition(" ")  # loaded and warm, waiting
        assert word == "ready" and json.loads(actual)["cores"] == [core]
        for _ in range(3):
            proc.stdin.write("run\n")
            proc.stdin.flush()
            assert float(proc.stdout.readline()) > 0
        time.sleep(0.3)
        assert proc.poll() is None  # idle between rounds, as an instance between batches
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


def test_run_refuses_more_threads_than_cores(tmp_path):
    with pytest.raises(ValueError, match="--threads: 3 exceeds the 2 cores"):
        profiler.run(FAST, [1, 3], [1], tmp_path / "x.csv", topology=Topology(((0, 1),)), progress=False)


def group_members(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (from /proc: the group field of /proc/PID/stat)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


@pytest.mark.integration
def test_ctrl_c_leaves_a_valid_file_that_resumes_and_no_copy_running(tmp_path):
    out = tmp_path / "tiny.csv"
    # One runtime: the others' artefacts are test_runtimes.py's. Eager: nothing to compile. Each point
    # still takes seconds (a fresh process per point and per copy), so the interrupt, sent as soon as
    # the first point's row is written, lands while the second point is measured.
    cmd = [sys.executable, "-m", "packrat.cli", "profile", "--model", "tiny", "--threads", "1",
           "--batches", "1-2", "--warmup", "1", "--min-time", "0.5", "--contention", "--runtimes", "inductor",
           "--graph-mode", "eager", "--out", str(out), "--quiet"]
    # Ctrl-C's default action even when this test runs in the background (where SIGINT is ignored and
    # a child would inherit that), then Python's KeyboardInterrupt.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Interrupt once a point is written and, where there is room for copies, while they run (cli + 2+ copies).
    busy = 3 if len(detect().cores) > 1 else 1
    deadline, most = time.monotonic() + 60, 0
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n1,") < 1
                                           or most < busy):
        most = max(most, len(group_members(proc.pid)))
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    _, err = proc.communicate(timeout=30)
    assert not group_members(proc.pid)  # with contention (copies on 2+ cores) no copy outlives it
    if proc.returncode == 0:
        pytest.skip(f"profiling finished before the interrupt arrived (at most {most} processes seen of "
                    f"{busy} awaited; cores {detect().cores})")
    assert proc.returncode == 130, err
    assert "run the same command to resume" in err
    partial = load(out)
    assert len(partial.latency) == 1
    quick = list(cmd)
    quick[quick.index("--min-time") + 1] = "0.1"
    subprocess.run(quick, check=True, timeout=120)
    assert sorted(load(out).latency) == [(1, 1), (1, 2)]


# ---- the search -------------------------------------------------------------------------------------

def test_the_search_measures_part_of_the_grid_on_workers_started_once_and_resumes(tmp_path, fake_workers):
    out, topo = tmp_path / "search.csv", Topology.virtual(8)
    threads, batches = list(range(1, 9)), [1, 2, 4, 8, 16, 32]
    done = profiler.search_profile(ISOLATED, threads, batches, out, topology=topo, progress=False,
                                   runtimes=("inductor", "slow"))
    assert done.grid == 96 and done.points == len(fake_workers.calls) < 96 * 0.3
    assert len(set(fake_workers.calls)) == len(fake_workers.calls)  # no point twice
    assert len(fake_workers.started) == len(set(fake_workers.started))  # a (runtime, threads) started once
    assert "no unmeasured point can change a plan" in done.stopped
    report = done.to_json(out)
    assert report["runtimes"]["inductor"]["load_s"] == pytest.approx(0.5 * sum(r == "inductor" for r, _ in
                                                                                 fake_workers.started))
    assert report["points"] == done.points and report["unaccounted_s"] <= report["wall_s"]
    assert "search" in load(out).metadata
    fake_workers.calls.clear()
    again = profiler.search_profile(ISOLATED, threads, batches, out, topology=topo, progress=False,
                                    runtimes=("inductor", "slow"))
    assert fake_workers.calls == [] and again.points == done.points  # everything needed is in the file already


def test_workers_beyond_the_live_bound_are_stopped_least_recently_used_first(tmp_path, fake_workers, monkeypatch):
    monkeypatch.setattr(profiler, "LIVE_COPIES_PER_CORE", 0.25)  # 2 copies on 8 cores (isolated: one a group)
    live, most = [], []
    monkeypatch.setattr(FakeWorkers, "measure", lambda self, batch, measure=FakeWorkers.measure: (
        live.append(self) if self not in live else None, most.append(len(live)), measure(self, batch))[-1])
    monkeypatch.setattr(FakeWorkers, "close", lambda self: live.remove(self))
    profiler.search_profile(ISOLATED, list(range(1, 9)), [1, 2, 4, 8, 16, 32], tmp_path / "s.csv",
                            topology=Topology.virtual(8), progress=False, runtimes=("inductor", "slow"))
    assert max(most) == 2 and not live  # never more than the bound, every one stopped at the end


def test_a_spent_budget_measures_only_what_gives_every_batch_a_plan(tmp_path, fake_workers):
    out = tmp_path / "search.csv"
    done = profiler.search_profile(ISOLATED, list(range(1, 9)), [1, 2, 4, 8], out, topology=Topology.virtual(8),
                                   progress=False, budget_s=0.0)
    assert done.points == 6 and "budget of 0 s ended" in done.stopped  # one runtime's design points cover
    from packrat.planning.planner import Planner

    planner = Planner(done.profile.items(), 8, 8)
    assert all(planner.plan(8, b).instances for b in (1, 2, 4, 8))


def test_a_header_only_profile_resumes(tmp_path, fake_workers):
    out = tmp_path / "search.csv"
    with profiler.profiles.ProfileWriter(out, profiler.metadata(ISOLATED, Topology.virtual(2))):
        pass  # interrupted before its first point
    done = profiler.search_profile(ISOLATED, [1, 2], [1, 2, 4], out, topology=Topology.virtual(2), progress=False)
    assert done.points > 0 and load(out).latency


def test_the_full_grid_measures_every_point(tmp_path, fake_workers):
    done = profiler.search_profile(ISOLATED, [1, 2], [1, 2, 4], tmp_path / "grid.csv", topology=Topology.virtual(2),
                                   progress=False, full_grid=True, budget_s=None)
    assert done.points == done.grid == 6 and done.stopped == "the whole grid measured"


def test_the_search_refuses_more_threads_than_cores(tmp_path):
    with pytest.raises(ValueError, match="exceeds"):
        profiler.search_profile(ISOLATED, [1, 64], [1], tmp_path / "x.csv", topology=Topology.virtual(2),
                                progress=False)


def test_torch_compile_is_left_out_of_the_default_runtimes_with_the_reason(monkeypatch):
    import packrat.models.runtimes as engines

    monkeypatch.setattr(engines, "installed_runtimes", lambda: ("inductor", "onnxruntime", "torch-compile"))
    said = []
    assert profiler.default_runtimes(said.append) == ("inductor", "onnxruntime")
    assert said and "torch-compile left out" in said[0] and "--runtimes" in said[0]


def test_replay_writes_only_the_points_looked_up_with_their_figures(tmp_path):
    full = tmp_path / "full.csv"
    with profiler.profiles.ProfileWriter(full, {"model": "toy", "latency": "loaded"}) as writer:
        for t in range(1, 9):
            for b in (1, 2, 4, 8, 16, 32):
                writer.write({"threads": t, "batch": b, "latency_ms": amdahl(t, b) * 1.1,
                              "isolated_ms": amdahl(t, b), "copies": 8 // t})
    out = tmp_path / "replayed.csv"
    out.write_text("stale\n")  # a replay rewrites its output
    done = profiler.search_profile(FAST, list(range(1, 9)), [1, 2, 4, 8, 16, 32], out, replay=full, progress=False)
    source = load(full)
    assert done.points < done.grid == len(source.latency)
    assert all(source.latency[p] == pytest.approx(v, abs=1e-3) for p, v in done.profile.latency.items())
    assert all(source.isolated[p] == pytest.approx(v, abs=1e-3) for p, v in done.profile.isolated.items())
    assert done.profile.loaded and done.profile.metadata["replayed_from"] == str(full)
    assert done.profile.metadata["model"] == "toy"


def test_replay_of_a_point_outside_the_table_names_it(tmp_path):
    full = tmp_path / "full.csv"
    full.write_text("threads,batch,latency_ms\n1,1,10\n")
    said = []
    profiler.search_profile(FAST, [1], [1, 2], tmp_path / "out.csv", replay=full, progress=False, say=said.append)
    assert any("threads=1 batch=2" in line for line in said)


def test_a_build_the_budget_left_cannot_afford_is_never_started(tmp_path):
    """Inductor (compile mode: a 40 s package a point) is 20 % faster everywhere: with time, the search
    builds and measures it past its two first points; with 30 s, less than a wave of its packages costs,
    it is never built, and the profile says so."""
    full = tmp_path / "full.csv"
    with profiler.profiles.ProfileWriter(full, {"model": "toy", "mode": "compile", "latency": "loaded"}) as writer:
        for t in (1, 2):
            for b in (1, 2, 4, 8):
                for runtime, scale in (("inductor", 0.8), ("onnxruntime", 1.0)):
                    writer.write({"threads": t, "batch": b, "latency_ms": amdahl(t, b) * scale,
                                  "isolated_ms": amdahl(t, b) * scale, "copies": 2 // t, "runtime": runtime})

    def replayed(budget_s):
        return profiler.search_profile(FAST, [1, 2], [1, 2, 4, 8], tmp_path / f"{budget_s}.csv", replay=full,
                                       progress=False, budget_s=budget_s)

    assert len(replayed(1000.0).profile.by_runtime["inductor"]) > 2
    done = replayed(30.0)
    assert "inductor" not in done.profile.by_runtime and done.account.wall() < 30.0
    assert done.account.to_json()["runtimes"].get("inductor", {}).get("build_s", 0.0) == 0.0
    assert "inductor not measured" in done.profile.metadata["search"]
