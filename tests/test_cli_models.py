"""Several models from the command line: `packrat serve --model A --model B` with per-model profiles,
SLOs, tokenizers and labels (TorchServe faked), and `packrat status` with its node view."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from packrat.cli import status as cli_status
from packrat.cli.main import main
from packrat.cli.types import for_model, named
from packrat.deploy import archive as deploy_archive
from packrat.deploy import torchserve
from packrat.serving import default_profile

PROFILE = "# model: toy\nthreads,batch,latency_ms\n1,1,10\n2,1,6\n1,2,19\n2,2,11\n"


def test_named_values_and_which_model_they_are_for():
    parse = named(float)
    assert parse("resnet50=120") == ("resnet50", 120.0) and parse("80") == (None, 80.0)
    assert named(str)("runs/a=b/profile.csv") == (None, "runs/a=b/profile.csv")  # a path, not a name
    entries = [("a", 1.0), (None, 2.0)]
    assert for_model(entries, "a", ["a", "b"], "--slo") == [1.0]
    assert for_model(entries, "b", ["a", "b"], "--slo") == [2.0]  # bare: every model not named
    assert for_model(None, "a", ["a"], "--slo") == []
    with pytest.raises(ValueError, match="--slo names c, which is not served"):
        for_model([("c", 1.0)], "a", ["a", "b"], "--slo")
    with pytest.raises(ValueError, match="give --profile as NAME=VALUE"):
        for_model([(None, "p.csv")], "a", ["a", "b"], "--profile", bare_for_one=True)
    assert for_model([(None, "p.csv")], "a", ["a"], "--profile", bare_for_one=True) == ["p.csv"]
    with pytest.raises(argparse.ArgumentTypeError):
        named(lambda text: (_ for _ in ()).throw(argparse.ArgumentTypeError("bad")))("a=1")


@pytest.fixture
def served(tmp_path, monkeypatch):
    """serve with archives and TorchServe faked: what each archive's settings were, and the server."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles").mkdir()
    for name in ("tiny", "toy_cnn", "own"):
        (tmp_path / "profiles" / f"{name}.csv").write_text(PROFILE)
    monkeypatch.setattr(default_profile, "measure_profile", lambda *a, **k: pytest.fail("nothing to measure"))
    seen = {"settings": {}}

    def build(settings, out, **kw):
        seen["settings"][deploy_archive.archive_name(settings.model)] = asdict(settings)
        return out / f"{deploy_archive.archive_name(settings.model)}.mar"

    def start(server, mars, timeout):
        seen.update(server=server, mars=[m.name for m in mars])
        return server

    monkeypatch.setattr(deploy_archive, "build", build)
    monkeypatch.setattr(torchserve, "start", start)
    monkeypatch.setattr(torchserve, "handler_status", lambda server, model=None: {"profile": f"{model}.csv"})
    return seen


def test_serve_several_models_each_with_its_own_settings(served, capsys, tmp_path):
    (tmp_path / "labels.json").write_text('{"0": "tench"}')
    assert main(["serve", "--model", "tiny", "--model", "toy_cnn", "--profile", "tiny=profiles/own.csv",
                 "--slo", "toy_cnn=150", "--slo", "300", "--labels", "toy_cnn=labels.json",
                 "--enable-model-api", "--disable-token-auth"]) == 0
    tiny, toy = served["settings"]["tiny"], served["settings"]["toy_cnn"]
    assert tiny["profiles"] == ("profiles/own.csv",) and toy["profiles"] == ("profiles/toy_cnn.csv",)
    assert (tiny["slo_ms"], toy["slo_ms"]) == (300.0, 150.0)  # the bare one is every other model's
    assert (tiny["labels"], toy["labels"]) == (None, "labels.json")
    server = served["server"]
    assert server.models == ("tiny", "toy_cnn") and server.model == "tiny" and server.model_api
    assert served["mars"] == ["tiny.mar", "toy_cnn.mar"]
    out = capsys.readouterr().out
    assert "/predictions/tiny" in out and "/predictions/toy_cnn" in out and "packrat status" in out


@pytest.mark.parametrize("argv,error", [
    (["--model", "tiny", "--model", "toy_cnn", "--profile", "profiles/own.csv"], "give --profile as NAME=VALUE"),
    (["--model", "tiny", "--slo", "resnet50=100"], "--slo names resnet50, which is not served"),
    (["--model", "tiny", "--model", "tiny"], "both be served as tiny"),
    (["--model", "tiny", "--slo", "tiny=1", "--slo", "tiny=2"], "--slo given 2 times for tiny"),
    (["--model", "tiny", "--model", "toy_cnn", "--engine", "ray"], "--engine ray deploys one model"),
])
def test_serve_refuses_ambiguous_model_options(served, capsys, argv, error):
    assert main(["serve", *argv]) == 2
    assert error in capsys.readouterr().err
    assert "server" not in served


def test_one_model_keeps_a_bare_profile_and_the_archive_takes_named_values(served, capsys):
    assert main(["serve", "--model", "tiny", "--profile", "profiles/own.csv", "--slo", "90"]) == 0
    assert served["settings"]["tiny"]["profiles"] == ("profiles/own.csv",)
    assert served["settings"]["tiny"]["slo_ms"] == 90.0 and served["server"].models == ("tiny",)
    assert main(["archive", "--model", "toy_cnn", "--slo", "toy_cnn=40"]) == 0
    assert served["settings"]["toy_cnn"]["slo_ms"] == 40.0


def node_status(member: str, generation: int) -> dict:
    """A model's status as the engine gives it, with the node's view at `generation`."""
    plan = {"cores": 2, "objective": "the worst slowdown against each model alone", "worst_score": 1.4,
            "missed_slo": ["b-2-1"], "models": {
                "a-1-1": {"cores": [0], "shared_with": [], "idle": False, "plan_text": "1 × ⟨1, 4⟩",
                          "expected_latency_ms": 300.0, "alone_latency_ms": 210.0, "slowdown": 1.43},
                "b-2-1": {"cores": [1], "shared_with": [], "idle": False, "plan_text": "1 × ⟨1, 4⟩",
                          "expected_latency_ms": 90.0, "alone_latency_ms": 60.0, "slowdown": 1.5}}}
    members = {"a-1-1": {"model": "a", "pid": 1, "rate_rps": None, "batch": 4, "slo_ms": None},
               "b-2-1": {"model": "b", "pid": 2, "rate_rps": 12.5, "batch": 4, "slo_ms": 50.0}}
    moves = [{"generation": generation, "reason": "members a, b", "plan": "a: cores 0 …; b: cores 1 …",
              "started_at": 1_700_000_000.0, "seconds": 3.25}]
    return {"plan": {"batch": 4, "threads": 1, "instances": [{"threads": 1, "batch": 4, "cores": [0]}]},
            "mode": "compile", "reconfigurations": [],
            "node": {"member": member, "generation": generation, "step": 0, "plan": plan, "members": members,
                     "planned_by": "a-1-1", "epoch": 2,
                     "moves": moves, "share": {"cores": [0], "takes_turns": False}}}


@pytest.fixture
def two_models(monkeypatch):
    statuses = {"a": node_status("a-1-1", 3), "b": node_status("b-2-1", 2)}
    monkeypatch.setattr(torchserve.Server, "load", classmethod(
        lambda cls, run_dir: SimpleNamespace(model="a", models=("a", "b"))))
    monkeypatch.setattr(torchserve, "handler_status", lambda server, model=None: statuses[model or server.model])
    return statuses


def test_status_shows_every_model_and_the_node(two_models, capsys, tmp_path):
    assert main(["status", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "model a (compile)" in out and "model b (compile)" in out
    assert "node: 2 cores planned together (plan 3, by a, epoch 2)" in out
    assert "cannot meet the latency objective of: b" in out
    assert "load saturated" in out and "load 12.5 req/s" in out and "SLO 50 ms" in out
    assert "1 move(s)" in out and "3.25 s  members a, b" in out
    assert main(["status", "--run-dir", str(tmp_path), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert set(body["models"]) == {"a", "b"} and body["node"]["generation"] == 3  # the newest view
    assert body["node"]["models"]["b"]["cores"] == [1] and body["node"]["missed_slo"] == ["b"]
    assert body["node"]["models"]["a"]["slowdown"] == 1.43


def test_status_of_one_model_is_its_own(two_models, capsys, tmp_path):
    assert main(["status", "--run-dir", str(tmp_path), "--model", "b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == two_models["b"]
    assert main(["status", "--run-dir", str(tmp_path), "--model", "c"]) == 2
    assert "c is not served here (models: a, b)" in capsys.readouterr().err


def test_node_view_without_a_node_is_none():
    assert cli_status.node_view({"a": {"plan": {}}}) is None
