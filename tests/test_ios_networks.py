"""benchmarks/ios_networks.py's peers: their table cells and footnotes from a made-up report, the
--peers list, when a case's peers are run or read back, and one real worker run on `tiny`."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "ios_networks.py"
_SPEC = importlib.util.spec_from_file_location("benchmarks_ios_networks", _PATH)
ios_networks = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = ios_networks
_SPEC.loader.exec_module(ios_networks)

REPORT = {"model": "inception_v3", "batch": 1, "threads": 2, "operators": 119, "seconds": 300.0, "measurements": 900,
          "stopped_early": 100, "skipped": 50, "compare_sequential_ms": 60.0, "compare_greedy_ms": 70.0,
          "compare_ios_ms": 50.0, "kept": "searched", "parallel_stages": 4, "predicted_ios_ms": 49.0,
          "predicted_sequential_ms": 59.0, "ios_ms": 51.0, "sequential_ms": 61.0, "retimed_ios_ms": 50.0,
          "retimed_sequential_ms": 60.0, "switch_ms": 0.1}
REFUSED = "openvino refused for inception_v3: outputs differ"


def test_peer_cells_give_median_and_peer_over_ios_and_footnote_each_reason_once():
    notes = ios_networks.Footnotes()
    peers = {"onnxruntime": {"median_ms": 56.0}, "onnxruntime-parallel": {"median_ms": 40.0},
             "openvino": {"error": REFUSED}}
    cells = ios_networks.peer_cells(REPORT["compare_ios_ms"], peers, notes)
    assert cells == ["56.0 ms (IOS 1.12×)", "40.0 ms (IOS 0.80×)", "— [^1]"]
    assert ios_networks.peer_cells(50.0, {"openvino": {"error": REFUSED}, "onnxruntime": {"error": "boom"}},
                                   notes) == ["— [^1]", "— [^2]"]  # a reason seen before keeps its number
    assert notes.lines() == [f"[^1]: {REFUSED}", "[^2]: boom"]


def test_row_has_a_cell_under_each_peer_column():
    names = list(ios_networks.PEERS)
    row = ios_networks.row(REPORT, ["1.0 ms (IOS 0.02×)"] * len(names))
    header = ios_networks.head(names).splitlines()[0]
    assert row.count(" | ") == header.count(" | ")
    assert row.startswith("| inception_v3 | 1 | 2 | 119 |") and row.endswith(" 1.0 ms (IOS 0.02×) |")
    assert ios_networks.row(REPORT).count(" | ") == ios_networks.head([]).splitlines()[0].count(" | ")


def test_peer_list():
    assert ios_networks.peer_list("none") == [] and ios_networks.peer_list("") == []
    assert ios_networks.peer_list("openvino,onnxruntime,openvino") == ["openvino", "onnxruntime"]
    with pytest.raises(Exception, match="unknown peer"):
        ios_networks.peer_list("tensorrt")


def test_peers_run_once_per_case_and_missing_runtimes_are_never_kept(tmp_path, monkeypatch):
    commands = []

    def worker(command, marker):
        commands.append(command)
        wanted = command[command.index("--peers") + 1].split(",")
        return {"peers": {peer: {"median_ms": 1.0} for peer in wanted}}

    monkeypatch.setattr(ios_networks, "child_json", worker)
    monkeypatch.setattr(ios_networks, "not_installed", lambda peer: "openvino is not installed" * (peer == "openvino"))
    peers = list(ios_networks.PEERS)
    first = ios_networks.run_peers("tiny", 1, 1, peers, tmp_path)
    again = ios_networks.run_peers("tiny", 1, 1, peers, tmp_path)
    assert len(commands) == 1 and "--peer-worker" in commands[0]  # the second call read the kept file
    assert first == again and list(first) == peers
    assert first["openvino"] == {"error": "openvino is not installed"}
    assert "openvino" not in json.loads((tmp_path / "tiny-b1-t1.peers.json").read_text())["peers"]


def test_a_failed_worker_is_reported_and_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(ios_networks, "child_json", lambda command, marker: {"error": "exit 1: boom"})
    monkeypatch.setattr(ios_networks, "not_installed", lambda peer: None)
    found = ios_networks.run_peers("tiny", 1, 1, ["onnxruntime"], tmp_path)
    assert found == {"onnxruntime": {"error": "exit 1: boom"}} and not list(tmp_path.iterdir())


@pytest.mark.integration
def test_worker_times_each_installed_peer_on_tiny(tmp_path):
    found = ios_networks.run_peers("tiny", 1, 1, list(ios_networks.PEERS), tmp_path)
    for peer, result in found.items():
        if ios_networks.not_installed(peer):
            assert "not installed" in result["error"]
        else:
            assert result.get("median_ms", 0) > 0, (peer, result)
