"""CLI smoke tests: help, plan output, JSON, errors and exit statuses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from packrat.cli import main

PROFILE = """# model: toy
threads,batch,latency_ms
1,1,10
1,2,19
2,1,6
2,2,11
2,4,21
1,4,37
"""


@pytest.fixture
def profile(tmp_path) -> Path:
    path = tmp_path / "toy.csv"
    path.write_text(PROFILE)
    return path


def test_help_explains_every_command():
    exe = shutil.which("packrat", path=str(Path(sys.executable).parent)) or "packrat"
    top = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("profile", "plan", "plot", "demo"):
        assert command in top
    plan_help = subprocess.run([exe, "plan", "--help"], capture_output=True, text=True, check=True).stdout
    assert "fewer instances" in plan_help and "--json" in plan_help


def test_plan_json_is_the_documented_object(profile, capsys):
    assert main(["plan", "--profile", str(profile), "--threads", "2", "--batch", "4", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body == {"threads": 2, "batch": 4, "expected_latency_ms": 19.0, "fat_latency_ms": 21.0,
                    "instances": [{"threads": 1, "batch": 2, "cores": body["instances"][0]["cores"]},
                                  {"threads": 1, "batch": 2, "cores": body["instances"][1]["cores"]}]}
    cores = [c for inst in body["instances"] for c in inst["cores"]]
    assert len(set(cores)) == 2


def test_plan_for_more_cores_than_this_machine(profile, capsys):
    assert main(["plan", "--profile", str(profile), "--threads", "64", "--batch", "4", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert [i["threads"] for i in body["instances"]] == [2, 2, 2, 2]
    assert body["fat_latency_ms"] is None


def test_plan_table_for_every_batch(profile, capsys):
    assert main(["plan", "--profile", str(profile), "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "2×⟨1 threads, batch 2⟩" in out and "1.11×" in out


def test_plan_text_lists_cores_and_speedup(profile, capsys):
    assert main(["plan", "--profile", str(profile), "--threads", "2", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "cores" in out and "speedup 1.11×" in out


def test_no_plan_exits_2_with_one_line(profile, capsys):
    assert main(["plan", "--profile", str(profile), "--threads", "1", "--batch", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("packrat plan: error: batch 5 cannot be split") and "\n" not in err


def test_bad_profile_exits_2_naming_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("threads,batch\n1,1\n")
    assert main(["plan", "--profile", str(bad), "--batch", "1"]) == 2
    assert f"{bad}: missing column 'latency_ms'" in capsys.readouterr().err


@pytest.mark.parametrize("argv,flag", [
    (["plan", "--profile", "x.csv", "--batch", "0"], "--batch"),
    (["plan", "--profile", "x.csv", "--threads", "two"], "--threads"),
    (["profile", "--batches", "1-x"], "--batches"),
    (["profile", "--iters", "5", "--min-time", "2"], "--min-time"),
])
def test_bad_arguments_name_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert flag in capsys.readouterr().err


def test_plot_writes_pngs(profile, tmp_path, capsys):
    out = tmp_path / "plots"
    assert main(["plot", "--profile", str(profile), "--out", str(out)]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["toy-latency-heatmap.png", "toy-plan-vs-fat-T2.png"]
    assert all((out / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)
