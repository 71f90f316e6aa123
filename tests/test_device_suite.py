"""benchmarks/device_suite.sh end to end with tiny settings: every step's files exist and parse,
and SUMMARY.md has every step's command and tables."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from packrat.profiling.profiles import load
from packrat.machine.topology import detect

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "device_suite.sh"
T = min(2, detect().num_cores)
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("SUITE_")}
# The defaults' steps and kinds (a loaded profile of raw served figures under several runtimes, the
# peers, the oracle under each runtime), on tiny and small settings; bench and both IOS steps asked for too
# (every runtime at every point: IOS measured whether or not tiny leaves threads idle).
TINY = {"SUITE_MODEL": "tiny", "SUITE_THREADS": str(T), "SUITE_PROFILE_BATCHES": "1,2", "SUITE_PROFILE_MIN_TIME": "0.1",
        "SUITE_GRAPH_MODE": "script", "SUITE_RUNTIMES": "inductor,onnxruntime",
        "SUITE_PEERS_BATCHES": "2", "SUITE_PEERS_ROUNDS": "1", "SUITE_PEERS": "packrat,fat,eager,onnxruntime",
        "SUITE_BENCH_BATCHES": "2", "SUITE_BENCH_ROUNDS": "2", "SUITE_ORACLE_BATCHES": "2",
        "SUITE_ORACLE_ROUNDS": "2", "SUITE_ORACLE_CONFIGS": "6", "SUITE_IOS_MODELS": "tiny", "SUITE_IOS_THREADS": "2",
        "SUITE_IOS_BATCHES": "1", "SUITE_IOS_PEERS": "onnxruntime", "SUITE_IOS_PLAN_MODEL": "tiny",
        "SUITE_IOS_PLAN_THREADS": "1,2", "SUITE_IOS_PLAN_ROUNDS": "2", "SUITE_IOS_PLAN_RUNTIMES": "inductor",
        "SUITE_EVERY_RUNTIME": "1",
        "SUITE_STEPS": "profile,peers,oracle,bench,ios,ios-plan"}


def missing_tools() -> list[str]:
    tools = ["bash", "timeout", "realpath"] + (["taskset"] if T < detect().num_cores else [])
    return [tool for tool in tools if shutil.which(tool) is None]


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    if missing_tools():
        pytest.skip(f"the suite needs {', '.join(missing_tools())}")
    out = tmp_path_factory.mktemp("suite") / "out"
    env = {**CLEAN, **TINY}
    done = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=env, timeout=360)
    assert done.returncode == 0, done.stderr[-4000:]
    return out, done


@pytest.mark.integration
def test_runs_every_step_within_budget(suite):
    out, done = suite
    assert done.stdout.strip() == str(out / "SUMMARY.md")  # stdout: only the summary's path
    rows = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
    steps = {row[1]: row for row in rows if row[0] == "step"}
    assert list(steps) == ["profile", "peers", "oracle", "bench", "ios", "ios-plan"]
    assert all(row[5] == "ok" and int(row[3]) <= int(row[4]) for row in steps.values())
    for key in steps:  # progress and each step's time on stderr
        assert f"({key}) took " in done.stderr
    machine = json.loads((out / "machine.json").read_text())
    assert machine["threads"] == T and len(machine["cores"]) == T and machine["settings"]["SUITE_MODEL"] == "tiny"


@pytest.mark.integration
def test_profile(suite):
    out, _ = suite
    profile = load(out / "tiny.csv")
    assert profile.metadata["model"] == "tiny" and profile.loaded  # loaded, the product's default
    assert profile.payload == "raw" and set(profile.measured_runtimes) <= {"inductor", "onnxruntime"}
    assert set(profile.threads) <= set(range(1, T + 1)) and profile.batches == [1, 2]
    assert {(1, 1), (1, 2)} <= set(profile.latency) and all(v > 0 for v in profile.latency.values())
    search = json.loads((out / "tiny-search.json").read_text())  # `packrat profile --json`: the search's account
    assert search["points"] == sum(map(len, profile.by_runtime.values())) <= search["grid"]
    assert search["budget_s"] == 130 and set(search["runtimes"]) >= set(profile.measured_runtimes)
    plans = json.loads((out / "tiny-plans.json").read_text())
    assert [p["batch"] for p in plans] == [1, 2]
    for p in plans:
        assert sum(i["batch"] for i in p["instances"]) == p["batch"]
        assert sum(i["threads"] for i in p["instances"]) <= T and p["expected_latency_ms"] > 0


@pytest.mark.integration
def test_pool_bench(suite):
    out, _ = suite
    [result] = json.loads((out / "pool-bench" / "pool-bench.json").read_text())
    assert (result["batch"], result["threads"], result["rounds"]) == (2, T, 2)
    assert all(result["median_ms"][k] > 0 for k in ("in-process", "pool-fat", "pool-plan"))


@pytest.mark.integration
def test_oracle(suite):
    out, _ = suite
    report = json.loads((out / "oracle.json").read_text())
    assert report["meta"]["family"] == "all" and report["meta"]["threads"] == T
    [entry] = report["batches"]
    labels = {c["label"] for c in entry["configs"]}
    runtimes = report["meta"]["runtimes"]
    assert set(entry["fat"]) == {f"⟨{T},2⟩" if r == "inductor" else f"⟨{T},2,{r}⟩" for r in runtimes} <= labels
    assert all(c["median_ms"] > 0 and len(c["samples_ms"]) == 2 for c in entry["configs"])
    assert entry["planner"]["loaded"]["label"] in labels
    assert report["summaries"][0]["best"] in labels


@pytest.mark.integration
def test_peers(suite):
    out, _ = suite
    peers = json.loads((out / "peers.json").read_text())
    table = peers["summary"]["2"]
    assert table["packrat"]["latency_ms"] > 0 and table["eager"]["latency_ms"] > 0
    assert peers["meta"]["pools"]["packrat"]["2"]["predicted_ms"] > 0


@pytest.mark.integration
def test_ios(suite):
    out, _ = suite
    report = json.loads((out / "ios-networks" / f"tiny-b1-t{min(2, T)}.json").read_text())
    assert (report["model"], report["batch"]) == ("tiny", 1)
    assert all(report[k] > 0 for k in ("compare_sequential_ms", "compare_greedy_ms", "compare_ios_ms"))


@pytest.mark.integration
def test_ios_plan(suite):
    out, _ = suite
    profile = load(out / "tiny-ios.csv")
    assert {"inductor", "ios"} <= set(profile.measured_runtimes) and profile.batches == [1]
    assert (out / "ios-schedules" / f"tiny-t{min(2, T)}-b1.json").exists()  # the ios step's search, reused
    plan = json.loads((out / "ios-plan.json").read_text())
    assert plan["batch"] == 1 and "ios" in plan
    [entry] = json.loads((out / "oracle-ios.json").read_text())["batches"]
    runtimes = {runtime for c in entry["configs"] for *_, runtime in c["config"]}
    assert "ios" in runtimes and all(c["median_ms"] > 0 for c in entry["configs"])


@pytest.mark.integration
def test_summary(suite):
    out, _ = suite
    text = (out / "SUMMARY.md").read_text()
    sections = text.split("\n## ")[1:]
    assert [s.split("\n")[0] for s in sections] == [
        "(a) Profile (the search)", "(b) packrat against its peers", "(c) Planner vs the oracle",
        "(d) Pool-only bench: fat vs plan", "(e) IOS on many cores",
        "(f) Per B: against the best peer, predicted / served, against the oracle", "(g) IOS instances in the plan"]
    tables = ["| t \\ b | 1 | 2 |", "| peer | median ms (rounds' min–max) |", "| B | configs | oracle (best) |", "| B | in-process |",
              "| model | batch |"]
    commands = ["-m packrat.cli profile --model tiny --threads 1-", "-m packrat.cli bench peers --model tiny",
                "-m packrat.cli bench oracle --model tiny", "-m packrat.cli bench --pool-only",
                " benchmarks/ios_networks.py --models tiny"]
    for section, table, command in zip(sections, tables, commands):
        assert "\nCommand: `" in section and command in section  # .venv/bin/python, or python3 without one
        assert table in section and "ok." in section
    assert "| B | plan ⟨threads, batch⟩ |" in sections[0] and "--budget-s 130 --json" in sections[0]
    assert "| runtime | build s | load s | measure s | points |" in sections[0]
    assert "\nBudgets: an estimate, not yet from a run" in text and "Missing:" not in text
    assert "| 2 | " in sections[2] and "| 2 | " in sections[3]  # a row for B = 2
    verdicts = sections[5]
    assert "| B | packrat's plan | packrat ms | best peer ms |" in verdicts
    row = next(line for line in verdicts.splitlines() if line.startswith("| 2 | "))
    assert "eager" in row or "onnxruntime" in row  # the fastest peer named, with its figure
    assert "the fastest without IOS" in sections[6] and "| B | configs | oracle (best) |" in sections[6]
    assert "IOS points in tiny-ios.csv: ⟨1,1⟩" in sections[6]  # every runtime everywhere: IOS from 1 thread


@pytest.mark.slow
def test_help_and_bad_settings(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "SUITE_PROFILE_KIND" in done.stdout
    assert subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True).returncode == 2
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "x")], capture_output=True, text=True,
                          env={**CLEAN, "SUITE_PROFILE_KIND": "loud"})
    assert done.returncode == 2 and "isolated or contention" in done.stderr
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "y")], capture_output=True, text=True,
                          env={**CLEAN, "SUITE_STEPS": "bench"})
    assert done.returncode == 1 and "no profile at" in done.stderr


def test_summary_keeps_the_peers_tables(tmp_path):
    from benchmarks.device_suite_summary import peers_tables

    table = "tiny, T = 2\n\n### B = 1\n\npackrat plan: 1×⟨2 threads, batch 1⟩\n\n| peer | median ms |\n|---|---|\n"
    (tmp_path / "peers.json").write_text(json.dumps({"markdown": table}))
    assert peers_tables(tmp_path) == table.splitlines() + [""]
    assert peers_tables(tmp_path / "missing") == []


def test_the_verdicts_per_b_judge_packrat_against_the_best_peer_its_prediction_and_the_oracle(tmp_path):
    from benchmarks.device_suite_summary import verdict_tables

    def row(ms: float, paired: float, low: float, high: float) -> dict:  # a peer's row: paired with packrat per round
        return {"latency_ms": ms, "vs_packrat": paired, "vs_packrat_spread": [low, high]}

    peers = {"summary": {"8": {"packrat": row(60.0, 1.0, 1.0, 1.0), "fat": row(50.0, 0.8, 0.8, 0.9),
                               "onnxruntime": row(58.0, 0.97, 0.9, 1.02), "eager": row(120.0, 2.0, 1.9, 2.1)},
                         "16": {"packrat": row(100.0, 1.0, 1.0, 1.0), "onnxruntime": row(113.0, 1.13, 1.1, 1.2)}},
             "meta": {"pools": {"packrat": {"8": {"predicted_ms": 42.0, "describe": "8×⟨2 threads, batch 1⟩"},
                                            "16": {"predicted_ms": 98.0, "describe": "4×⟨4 threads, batch 4⟩"}}}}}
    oracle = {"summaries": [{"batch": 16, "best": "4×⟨4,4⟩", "best_ms": 99.0,
                             "loaded": {"vs_best": 1.01, "vs_best_spread": [0.99, 1.04], "predicted_vs_measured": 0.99}}]}
    (tmp_path / "peers.json").write_text(json.dumps(peers))
    (tmp_path / "oracle.json").write_text(json.dumps(oracle))
    lines = "\n".join(verdict_tables(tmp_path)).splitlines()
    rows = [line for line in lines if line.startswith(("| 8 |", "| 16 |"))]
    assert rows[0] == ("| 8 | 8×⟨2 threads, batch 1⟩ | 60.0 | onnxruntime 58.0 | 0.97 (0.90–1.02) ✗ (no oracle) | 0.70 ✗ "
                       "| - | - | - |")
    # 113 / 99: the oracle beats the best peer by over 10 %, so packrat must be ahead by 10 % too
    assert rows[1] == ("| 16 | 4×⟨4 threads, batch 4⟩ | 100.0 | onnxruntime 113.0 | 1.13 (1.10–1.20) ✓ | 0.98 ✓ | "
                       "4×⟨4,4⟩ | 1.01 (0.99–1.04) ✓ | 0.99 |")
    # a peer that failed (or is not installed) could have been the best: the verdict is not known
    peers["summary"]["16"]["openvino-latency"] = {"error": "openvino is not installed", "skipped": True}
    (tmp_path / "peers.json").write_text(json.dumps(peers))
    row = [line for line in "\n".join(verdict_tables(tmp_path)).splitlines() if line.startswith("| 16 |")][0]
    assert "| onnxruntime 113.0 | 1.13 (1.10–1.20) ✗ (not measured: openvino-latency) |" in row


def test_the_summary_shows_what_a_step_left_and_says_what_is_missing_and_why(tmp_path):
    from benchmarks.device_suite_summary import summary

    (tmp_path / "machine.json").write_text(json.dumps({"settings": {"SUITE_MODEL": "tiny"}}))
    (tmp_path / "tiny.csv").write_text("# model: tiny\n# latency: loaded\nthreads,batch,latency_ms\n")  # a head only
    refused = "failed (exit 2): packrat bench: error: OUT/tiny.csv is too sparse to plan with:   B=2: it has no points"
    (tmp_path / "steps.tsv").write_text("budgets\tan estimate\n" + "".join(
        f"step\t{key}\t{key}\t5\t100\t{status}\n" for key, status in (("profile", "ok"), ("oracle", refused))))
    text = summary(tmp_path)  # raised ProfileError ("no data rows") on this head-only profile
    assert "Budgets: an estimate." in text and "tiny.csv holds no points (a head without rows)" in text
    assert "Missing: tiny-search.json, tiny-plans.json (the step: ok)." in text
    assert f"Missing: oracle.json (the step: {refused})." in text
    (tmp_path / "tiny-search.json").write_text('{"points": 0, "grid": 4, "wall_s": 3.5}')  # fewer keys than today's
    assert "| 0 | 4 | - | 3.5 | - | - | - |" in summary(tmp_path)


@pytest.mark.integration
def test_the_suite_goes_on_past_a_profile_without_points_and_an_oracle_that_refuses_it(tmp_path):
    if missing_tools():
        pytest.skip(f"the suite needs {', '.join(missing_tools())}")
    out = tmp_path / "out"
    out.mkdir()
    (out / "tiny.csv").write_text("# model: tiny\n# mode: eager\n# latency: loaded\nthreads,batch,latency_ms\n")
    env = {**CLEAN, **TINY, "SUITE_STEPS": "oracle,peers", "SUITE_PEERS": "packrat"}
    done = subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 3 and "NOT OK: oracle" in done.stderr, done.stderr[-3000:]
    text = (out / "SUMMARY.md").read_text()
    assert "failed (exit 2): packrat bench: error: " in text and "is too sparse to plan with:" in text
    assert "B=2: it has no points" in text and "packrat profile --model tiny" in text
    peers = json.loads((out / "peers.json").read_text())  # the peers ran on: packrat said why it could not
    assert "holds no points" in peers["summary"]["2"]["packrat"]["error"]
