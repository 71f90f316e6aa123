"""Measuring workers that live across points (measuring.Workers) and builds off the measured path
(builds.py): the point process's protocol, a reused worker against fresh processes, the build packing."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
import time

import pytest

from packrat.errors import ProfilingError
from packrat.machine.topology import Topology, detect
from packrat.models.zoo import compiled_package, resolve
from packrat.profiling import builds, measuring
from packrat.profiling.point import budgeted
from packrat.settings import COMPILE_CACHE_ENV

EAGER = measuring.ProfileSettings(model="tiny", warmup=1, iters=None, min_time=0.2, graph_mode="eager")


def two_cores() -> Topology:
    cores = detect().cores
    if len(cores) < 2:
        pytest.skip("needs two cores")
    return Topology((tuple(cores[:2]),))


def test_a_point_ends_at_its_count_of_runs_within_the_min_time():
    assert len(budgeted(lambda: 1, None, 60.0, 5)) == 5  # long before the minute
    assert len(budgeted(lambda: 1, None, 0.0, 5)) == 3  # the min-time's 3 runs
    assert len(budgeted(lambda: 1, 7, None, 5)) == 7  # a count asked for is kept
    cmd, _ = measuring._command(EAGER, 1, None, [0])
    assert "--batch" not in cmd and cmd[cmd.index("--max-runs") + 1] == str(measuring.DEFAULT_MAX_RUNS)


@pytest.mark.integration
def test_a_loaded_copy_takes_point_after_point():
    core = detect().cores[-1]
    cmd, _ = measuring._command(dataclasses.replace(EAGER, payload="raw"), 1, None, [core])
    with subprocess.Popen(cmd + ["--loaded"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        def say(line: str) -> str:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            return proc.stdout.readline()

        assert proc.stdout.readline().startswith("ready ")  # started, no point yet
        for batch in (2, 1):
            word, _, actual = say(f"batch {batch}").partition(" ")
            assert word == "ready" and json.loads(actual)["mode"] == "eager" and json.loads(actual)["cores"] == [core]
            assert float(say("run")) > 0
            served = [float(x) for x in say("serve").split()]  # its ms, then decode, model, encode
            assert len(served) == 4 and served[0] >= served[2] > 0
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


@pytest.mark.integration
def test_a_failing_worker_names_the_point_and_leaves_no_copy(monkeypatch):
    started = []

    class Recorded(measuring._Copy):
        def __init__(self, *args):
            super().__init__(*args)
            started.append(self)

    monkeypatch.setattr(measuring, "_Copy", Recorded)
    workers = measuring.Workers(dataclasses.replace(EAGER, model="no_such_model"), 1, two_cores())
    with pytest.raises(ProfilingError, match=r"threads=1 batch=3 under load \(2 copies\) failed: .*unknown model"):
        workers.measure(3)
    assert len(started) == 2 and all(copy.proc.returncode is not None for copy in started)
    with pytest.raises(ProfilingError, match="stopped"):
        workers.measure(1)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.serial  # compares timings: another test beside it would skew one side
def test_a_reused_worker_measures_what_fresh_processes_measure():
    """tiny, eager, two 1-thread copies in lockstep: three batches on one Workers against fresh
    measure() calls, in the order reused, fresh, fresh, reused per batch, so a drift of the machine
    over the four falls on both alike. They agree within the points' spread: 3 x the largest MAD,
    plus how far each kind's two figures lie apart (other work on a shared VM comes and goes within
    seconds: loaded p50s of 1.5 and 5.2 ms minutes apart here), plus 0.3 ms of timer and hand-off."""
    topology = two_cores()
    settings = dataclasses.replace(EAGER, warmup=5, min_time=0.3, max_runs=60, payload="raw")
    with measuring.Workers(settings, 1, topology) as workers:
        for batch in (1, 4, 2):
            reused = [workers.measure(batch)]
            fresh = [measuring.measure(settings, 1, batch, topology) for _ in range(2)]
            reused.append(workers.measure(batch))
            assert all(set(f) <= set(r) and r["copy_cores"] == f["copy_cores"] for r in reused for f in fresh)
            for figure, spread in (("p50_ms", "mad_ms"), ("served_p50_ms", "served_mad_ms")):
                (r1, r2), (f1, f2) = ([row[figure] for row in rows] for rows in (reused, fresh))
                tolerance = 3 * max(row[spread] for row in reused + fresh) + abs(r1 - r2) + abs(f1 - f2) + 0.3
                assert abs((r1 + r2) / 2 - (f1 + f2) / 2) <= tolerance, (batch, figure, reused, fresh)
    assert workers.load_s > 0 and workers.measure_s > 0


# ---- builds ------------------------------------------------------------------------------------------

class FakeBuild:
    """A build process that finishes after a few polls, leaving the package (or failing)."""
    running: list = []

    def __init__(self, settings, threads, batch, core, fail=False):
        self.key, self.core, self.polls, self.fail = (threads, batch), core, 3, fail
        self.path = compiled_package(resolve(settings.model), batch, threads=threads)
        self.returncode = None
        self.log = tempfile.TemporaryFile()
        self.log.write(b"chatter\nRuntimeError: no compiler\n")
        FakeBuild.running.append(self)

    def poll(self):
        self.polls -= 1
        if self.polls <= 0 and self.returncode is None:
            FakeBuild.running.remove(self)
            self.returncode = 1 if self.fail else 0
            if not self.fail:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.path.touch()
        return self.returncode


def test_builds_pack_a_build_per_core_once_per_key(tmp_path, monkeypatch):
    monkeypatch.setenv(COMPILE_CACHE_ENV.name, str(tmp_path))
    monkeypatch.setattr(builds, "POLL_S", 0.0)
    monkeypatch.setattr(FakeBuild, "running", [])
    starts, most = [], []

    def start(settings, threads, batch, core):
        assert settings.runtime == "inductor" and core not in {b.core for b in FakeBuild.running}  # a free core
        starts.append((threads, batch))
        build = FakeBuild(settings, threads, batch, core, fail=(threads, batch) == (3, 1))
        most.append(len(FakeBuild.running))
        return build

    monkeypatch.setattr(builds, "_start", start)
    settings = dataclasses.replace(EAGER, graph_mode="compile")
    points = [("inductor", 1, 1), ("inductor", 1, 1), ("inductor", 2, 4), ("inductor", 4, 2), ("onnxruntime", 1, 1),
              ("inductor", 3, 8), ("inductor", 3, 1)]
    compiled_package(resolve("tiny"), 4, threads=2).touch()  # built before
    said = []
    found = builds.build_all(settings, points, Topology.virtual(2), said.append)
    assert sorted(starts) == [(1, 1), (3, 1), (3, 8), (4, 2)] and max(most) == 2  # once each, two at a time
    assert starts[0] == (3, 8)  # the largest batch first: it takes longest
    assert found["inductor"] | {"seconds": 0} == {"built": 3, "reused": 1, "failed": 1, "seconds": 0}
    assert found["onnxruntime"] == {"built": 0, "reused": 0, "failed": 0, "seconds": 0.0}
    assert said == ["building inductor threads=3 batch=1 failed: RuntimeError: no compiler"]
    starts.clear()
    again = builds.build_all(settings, points[:4], Topology.virtual(2), said.append)
    assert starts == [] and again["inductor"]["reused"] == 3
    assert builds.build_all(EAGER, points, Topology.virtual(2))["inductor"]["built"] == 0  # eager: nothing to build


@pytest.mark.integration
@pytest.mark.slow
def test_a_real_build_is_the_package_the_points_load(tmp_path, monkeypatch):
    """tiny's packages at ⟨1, 2⟩ and ⟨2, 2⟩ built side by side, then loaded by a worker, not built again."""
    monkeypatch.setenv(COMPILE_CACHE_ENV.name, str(tmp_path))
    settings = dataclasses.replace(EAGER, graph_mode="compile", served=False, contention=False)
    found = builds.build_all(settings, [("inductor", 1, 2), ("inductor", 2, 2)], two_cores())
    assert found["inductor"]["built"] == 2 and found["inductor"]["seconds"] > 0
    spec = resolve("tiny")
    assert sorted(p.name.split("-", 2)[-1] for p in tmp_path.glob("tiny-*.pt2")) == ["t1-b2.aoti.pt2", "t2-b2.aoti.pt2"]
    made = {p: p.stat().st_mtime for p in tmp_path.glob("*.pt2")}
    with measuring.Workers(settings, 2, two_cores()) as workers:
        started = time.monotonic()
        row = workers.measure(2)
    assert row["mode"] == "compile" and time.monotonic() - started < 20  # loaded, not built
    assert {p: p.stat().st_mtime for p in tmp_path.glob("*.pt2")} == made  # nothing else built (no ladder)
    assert compiled_package(spec, 2, threads=2).exists() and not compiled_package(spec, 1, threads=2).exists()
