"""Real TorchServe serving two packrat archives: both join one plan of the cores, `packrat status`
shows the node, and a model unregistered or registered through the management API leaves or joins it."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request

import pytest

from packrat.cli.main import main
from packrat.deploy import archive, torchserve
from packrat.settings import Settings
from test_serving_integration import PROFILE

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("java") is None, reason="TorchServe needs Java 11+")]


def answered(server, model: str) -> int:
    request = urllib.request.Request(f"{server.inference_url}/predictions/{model}", data=bytes(3 * 32 * 32 * 4),
                                     headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status


def share(server, model: str) -> dict:
    return torchserve.handler_status(server, model)["node"]["share"]


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def test_models_join_and_leave_the_node_through_the_management_api(tmp_path, capsys):
    profile = tmp_path / "tiny.csv"
    profile.write_text(PROFILE)
    mars = [archive.build(Settings("tiny", profiles=[profile], max_batch=4), tmp_path / "model_store", name=name,
                          max_batch_delay_ms=20) for name in ("one", "two")]
    server = torchserve.start(torchserve.Server(tmp_path / "run", "one", torchserve.Ports.free(), token_auth=False,
                                                models=("one", "two"), model_api=True), mars, timeout=180)
    try:
        assert answered(server, "one") == 200 and answered(server, "two") == 200
        assert main(["status", "--run-dir", str(server.run_dir), "--json"]) == 0
        body = json.loads(capsys.readouterr().out)
        assert set(body["models"]) == {"one", "two"} and set(body["node"]["models"]) == {"one", "two"}
        assert body["node"]["moves"] and all("reason" in move for move in body["node"]["moves"])
        cores = [body["node"]["models"][name]["cores"] for name in ("one", "two")]
        turns = [body["node"]["models"][name]["takes_turns_with"] for name in ("one", "two")]
        assert turns == [["two"], ["one"]] or not set(cores[0]) & set(cores[1])  # never one core unshared twice
        assert main(["status", "--run-dir", str(server.run_dir)]) == 0
        assert "move(s) of the node's cores" in capsys.readouterr().out

        torchserve.unregister(server, "two")
        everything = {"cores": sorted(set(cores[0]) | set(cores[1])), "takes_turns": False}  # the node's cores
        assert wait_for(lambda: share(server, "one") == everything), share(server, "one")
        assert answered(server, "one") == 200

        torchserve.register(server, mars[1], "two")
        assert wait_for(lambda: share(server, "two") is not None and share(server, "one") != everything)
        assert answered(server, "two") == 200 and answered(server, "one") == 200
        assert torchserve.Server.load(server.run_dir).models == ("one", "two")
    finally:
        torchserve.stop(server)
