"""Real TorchServe: a step load makes the packrat handler reconfigure, and every
request still gets the right answer."""

from __future__ import annotations

import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from packrat.deploy import torchserve
from packrat.deploy import archive
from packrat.cli.main import main
from packrat.models.zoo import prepare, resolve
from packrat.settings import Settings
from test_serving_integration import PROFILE, post

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("java") is None, reason="TorchServe needs Java 11+")]


def test_step_load_reconfigures_without_losing_a_request(tmp_path, capsys):
    profile = tmp_path / "tiny.csv"
    profile.write_text(PROFILE)
    fast = {"alpha": 0.5, "window": 3, "period_s": 0.5}  # react within ~2 s so the test stays short
    mar = archive.build(Settings("tiny", profiles=[profile], max_batch=8, estimator=fast), tmp_path / "model_store",
                        max_batch_delay_ms=30)
    server = torchserve.start(torchserve.Server(tmp_path / "run", "tiny", torchserve.Ports.free(), token_auth=False), mar,
                           timeout=180)
    module, _, _ = prepare(resolve("tiny"), 2, "eager")  # the model itself: nothing compiled for the reference
    samples = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        expected = [torch.softmax(row, 0).topk(5).indices.tolist() for row in module(samples)]
    bodies = [s.numpy().tobytes() for s in samples]
    wrong: list[str] = []

    def client(index: int, stop: threading.Event) -> int:
        sent = 0
        while not stop.is_set():
            status, body = post(server, bodies[index], "application/octet-stream", token=None)
            if status != 200 or [p["class"] for p in body["predictions"]] != expected[index]:
                wrong.append(f"{status} {body}")
            sent += 1
        return sent

    def load(clients: int, until, then_s: float = 0.0, timeout_s: float = 90.0) -> int:
        """`clients` closed-loop clients until until(the reconfigurations so far) holds, and then_s
        longer: each step of the load lasts until the handler has followed it (seconds here, more on
        a slow day)."""
        stop = threading.Event()
        with ThreadPoolExecutor(clients) as pool:
            sending = [pool.submit(client, i, stop) for i in range(clients)]
            deadline = time.monotonic() + timeout_s
            try:
                while not until(records := torchserve.handler_status(server)["reconfigurations"]):
                    assert time.monotonic() < deadline, f"no such reconfiguration in {timeout_s:.0f} s: {records}"
                    time.sleep(0.25)
                time.sleep(then_s)
            finally:
                stop.set()
            return sum(future.result() for future in sending)

    try:
        sent = 0
        # low → high → low: down from the plan for B=8, up with the load, and back down after it
        sent += load(1, lambda records: records and records[-1]["to_batch"] < 4)
        sent += load(16, lambda records: records[-1]["to_batch"] >= 4)
        sent += load(1, lambda records: records[-1]["to_batch"] == 1, then_s=2.0)  # and served on the last plan
        assert wrong == []
        status = torchserve.handler_status(server)
        records = status["reconfigurations"]
        assert len(records) >= 2, records
        assert all(r["failed_requests"] == 0 and not r.get("error") for r in records)  # TorchServe drops nulls
        # Up with the load and back down after it. The load is the requests in the pool at once: 16
        # Python client threads keep only 4-8 of them there (the tiny model is quicker than its clients).
        targets = [r["to_batch"] for r in records]
        assert max(targets) >= 4 and 1 in targets[targets.index(max(targets)):], targets
        assert status["plan"]["batch"] == records[-1]["to_batch"]
        assert main(["status", "--run-dir", str(server.run_dir), "--json"]) == 0
        assert '"reconfigurations"' in capsys.readouterr().out
        assert sent > 100
    finally:
        torchserve.stop(server)
