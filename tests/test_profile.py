"""Profile files: round trip, loaded and isolated figures, older layouts, the published layout, and every
rejection."""

from __future__ import annotations

from pathlib import Path

import pytest

from packrat.profiling.profiles import COLUMNS, LEGACY_COLUMNS, ProfileWriter, load
from packrat.errors import ProfileError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "reference-profiles"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.csv"
    path.write_text(text)
    return path


def test_round_trip_keeps_points_and_metadata(tmp_path):
    path = tmp_path / "out" / "p.csv"
    meta = {"model": "tiny", "mode": "script", "cores": "2"}
    with ProfileWriter(path, meta) as writer:
        writer.write({"threads": 1, "batch": 2, "latency_ms": 3.5, "p50_ms": 3.4, "p99_ms": 4.0,
                      "std_ms": 0.1, "iterations": 100})
        writer.write({"threads": 2, "batch": 2, "latency_ms": 2.0})
    with ProfileWriter(path, {"model": "ignored when appending"}) as writer:
        writer.write({"threads": 2, "batch": 4, "latency_ms": 3.0})
    profile = load(path)
    assert profile.metadata == meta
    assert profile.latency == {(1, 2): 3.5, (2, 2): 2.0, (2, 4): 3.0}
    assert profile.threads == [1, 2] and profile.batches == [2, 4]
    assert profile.rows[0]["p99_ms"] == "4.0000"


def test_only_required_columns_are_needed(tmp_path):
    profile = load(write(tmp_path, "batch,latency_ms,threads\n4,10,2\n"))
    assert profile.latency == {(2, 4): 10.0}


@pytest.mark.parametrize("text,message", [
    ("", "empty profile"),
    ("threads,batch\n1,1\n", "missing column 'latency_ms'"),
    ("threads,batch,latency_ms\n", "no data rows"),
    ("threads,batch,latency_ms\n1,1,abc\n", "row 2: latency_ms is not a number: 'abc'"),
    ("threads,batch,latency_ms\n1,1.5,3\n", "row 2: batch is not an integer"),
    ("threads,batch,latency_ms\n1,1,3\n1,2,0\n", "row 3: latency_ms must be > 0"),
    ("threads,batch,latency_ms\n1,1,-2\n", "row 2: latency_ms must be > 0"),
    ("threads,batch,latency_ms\n1,1,nan\n", "row 2: latency_ms is not finite"),
    ("threads,batch,latency_ms\n0,1,2\n", "row 2: threads and batch must be >= 1"),
    ("# model: x\nthreads,batch,latency_ms\n1,1,2\n1,1,3\n", "row 4: duplicate point threads=1 batch=1"),
    ("threads,batch,latency_ms\n1,1\n", "row 2: latency_ms is not a number: None"),
    ("# latency: loaded\nthreads,batch,latency_ms\n1,1,2\n", "a loaded profile ('# latency: loaded') needs an "
                                                             "isolated_ms column"),
    ("# latency: busy\nthreads,batch,latency_ms\n1,1,2\n", "metadata 'latency: busy' is neither loaded nor isolated"),
    ("# latency: loaded\nthreads,batch,latency_ms,isolated_ms\n1,1,2,\n", "row 3: isolated_ms is not a number"),
    ("# latency: loaded\nthreads,batch,latency_ms,isolated_ms,copies\n1,1,2,,1\n", "row 3: isolated_ms is not a number"),
    ("# latency: loaded\nthreads,batch,latency_ms,isolated_ms,copies\n1,1,2,,x\n", "row 3: copies is not an integer"),
    ("# latency: loaded\nthreads,batch,latency_ms,isolated_ms\n1,1,2,0\n", "row 3: isolated_ms must be > 0"),
])
def test_rejections_name_file_row_and_problem(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ProfileError) as info:
        load(path)
    assert str(info.value).startswith(str(path))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ProfileError, match="cannot read"):
        load(tmp_path / "nope.csv")


def test_append_refuses_foreign_header(tmp_path):
    path = write(tmp_path, "batch,threads,latency_ms\n1,1,2\n")
    with pytest.raises(ProfileError, match="cannot append"):
        ProfileWriter(path, {})
    assert list(COLUMNS[:3]) == ["threads", "batch", "latency_ms"]


def test_published_layout_keeps_script_sequential_rows(tmp_path):
    header = "benchmark,topology,pinning,allocator,instance_id,interop_threads,intraop_threads,batch_size," \
             "latency(min),latency(avg),latency(max),flops\n"
    rows = ["resnet_manual_none,sequential,numactl,default,1,1,1,1,1,50,60,0",
            "resnet_manual_script,interleave,numactl,default,1,1,1,1,1,40,60,0",
            "resnet_manual_script,sequential,numactl,default,1,1,1,1,1,30,60,0",
            "resnet_manual_script,sequential,numactl,default,1,1,2,1,1,20,60,0"]
    profile = load(write(tmp_path, header + "\n".join(rows) + "\n"))
    assert profile.latency == {(1, 1): 30.0, (2, 1): 20.0}
    assert profile.metadata["model"] == "resnet"
    assert not profile.loaded and profile.isolated == profile.latency  # measured alone, one instance at a time


@pytest.mark.skipif(not SHARED.exists(), reason="reference profiles not present")
@pytest.mark.parametrize("name", ["resnet", "inception", "bert", "gpt2"])
def test_reference_profiles_load_as_16_by_11(name):
    profile = load(SHARED / f"{name}_large-batches.csv")
    assert profile.threads == list(range(1, 17))
    assert profile.batches == [2 ** k for k in range(11)]


# --- loaded and isolated figures -------------------------------------------------------------

LOADED = {"model": "tiny", "mode": "script", "latency": "loaded", "cores": "4"}


def write_loaded(path: Path) -> None:
    with ProfileWriter(path, LOADED) as writer:
        writer.write({"threads": 1, "batch": 2, "latency_ms": 5.0, "isolated_ms": 3.5, "copies": 4, "p50_ms": 4.9,
                      "p99_ms": 6.0, "std_ms": 0.2, "iterations": 400, "copy_cores": [[0], [1], [2], [3]]})
        writer.write({"threads": 4, "batch": 2, "latency_ms": 2.0, "isolated_ms": 2.0, "copies": 1})


def test_loaded_round_trip_keeps_both_figures(tmp_path):
    path = tmp_path / "p.csv"
    write_loaded(path)
    with ProfileWriter(path, LOADED) as writer:  # resuming appends
        writer.write({"threads": 2, "batch": 2, "latency_ms": 3.0, "isolated_ms": 2.5, "copies": 2})
    assert path.read_text().splitlines()[len(LOADED)] == ",".join(COLUMNS)
    profile = load(path)
    assert profile.loaded and profile.metadata == LOADED and profile.figures == ("loaded", "isolated")
    assert profile.latency == {(1, 2): 5.0, (2, 2): 3.0, (4, 2): 2.0}
    assert profile.isolated == {(1, 2): 3.5, (2, 2): 2.5, (4, 2): 2.0}
    assert profile.items() == profile.items("loaded") == [(1, 2, 5.0), (2, 2, 3.0), (4, 2, 2.0)]
    assert profile.items("isolated") == [(1, 2, 3.5), (2, 2, 2.5), (4, 2, 2.0)]
    assert [row["copies"] for row in profile.rows] == ["4", "1", "2"]


def test_isolated_profile_has_no_loaded_figures(tmp_path):
    path = tmp_path / "p.csv"
    with ProfileWriter(path, {"model": "tiny", "latency": "isolated"}) as writer:
        writer.write({"threads": 1, "batch": 1, "latency_ms": 3.0, "isolated_ms": 3.0, "copies": 1})
    profile = load(path)
    assert not profile.loaded and profile.figures == ("isolated",)
    assert profile.items() == profile.items("isolated") == [(1, 1, 3.0)]
    with pytest.raises(ProfileError, match=r"tiny profile has no loaded latencies: it was measured in isolation; "
                                           r"re-run `packrat profile --contention`"):
        profile.items("loaded")
    with pytest.raises(ValueError, match="latency must be one of loaded, isolated"):
        profile.items("fastest")


def test_older_profiles_load_as_isolated_and_take_isolated_points(tmp_path):
    path = write(tmp_path, "# model: tiny\n" + ",".join(LEGACY_COLUMNS) + "\n1,1,3.0,2.9,4.0,0.1,100\n")
    profile = load(path)
    assert not profile.loaded and profile.isolated == profile.latency == {(1, 1): 3.0}
    with ProfileWriter(path, {"model": "tiny"}) as writer:  # isolated: written in the file's own layout
        writer.write({"threads": 2, "batch": 1, "latency_ms": 2.0, "isolated_ms": 2.0, "copies": 1, "p50_ms": 1.9})
    assert path.read_text().splitlines()[-1] == "2,1,2.0000,1.9000,,,"
    assert load(path).items("isolated") == [(1, 1, 3.0), (2, 1, 2.0)]


@pytest.mark.parametrize("existing,new", [("isolated", "loaded"), ("loaded", "isolated"), ("legacy", "loaded")])
def test_append_refuses_the_other_kind(tmp_path, existing, new):
    path = tmp_path / "p.csv"
    if existing == "loaded":
        write_loaded(path)
    elif existing == "legacy":
        write(tmp_path, ",".join(LEGACY_COLUMNS) + "\n1,1,3,3,3,0,1\n")
    else:
        with ProfileWriter(path, {"latency": "isolated"}) as writer:
            writer.write({"threads": 1, "batch": 1, "latency_ms": 3.0})
    before = path.read_text()
    with pytest.raises(ProfileError, match=f"cannot append {new} measurements to a profile of "
                                           f"{existing.replace('legacy', 'isolated')} ones"):
        ProfileWriter(path, {"latency": new})
    assert path.read_text() == before


def test_a_profile_from_before_graph_modes_reads_as_torchscript(tmp_path):
    """Profiles taken before compile became the default say no mode (or script): they are served
    in TorchScript, the mode their latencies were measured in; a profile's own mode is kept."""
    from packrat.models.modes import served

    old = tmp_path / "old.csv"
    old.write_text("# model: resnet50\nthreads,batch,latency_ms\n1,1,100\n")
    assert load(old).metadata["mode"] == "script" and served(load(old).metadata["mode"]) == "script"
    new = tmp_path / "new.csv"
    new.write_text("# model: resnet50\n# mode: compile\nthreads,batch,latency_ms\n1,1,80\n")
    assert served(load(new).metadata["mode"]) == "compile"
    ios = tmp_path / "ios.csv"
    ios.write_text("# model: resnet50\n# mode: ios\nthreads,batch,latency_ms\n1,1,80\n")
    assert served(load(ios).metadata["mode"]) == "compile"  # IOS instances: their schedules decide
