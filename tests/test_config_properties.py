"""The project's config.properties as the manual uses it (docs/torchserve.md): a plain
`torchserve --start` from the project root serving packrat archives, with packrat's quiet log config."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

from packrat.deploy import torchserve
from packrat.machine.topology import detect

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "config.properties"
MANUAL = (ROOT / "docs" / "torchserve.md").read_text()
PROFILE = "threads,batch,latency_ms\n" + "".join(
    f"{t},{b},{b * 2.0 / t ** 0.5}\n" for t in range(1, detect().num_cores + 1) for b in (1, 2))


def properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))


def manual_commands() -> list[list[str]]:
    """The shell lines of the manual's section "TorchServe without `packrat serve`" (archive, start, stop)."""
    block = re.search(r"## TorchServe without `packrat serve`.*?```bash\n(.*?)```", MANUAL, re.S).group(1)
    return [line.split("#")[0].split() for line in block.splitlines() if line.strip()]


def log_config_paths(config: dict[str, str]) -> list[str]:
    return re.findall(r"-Dlog4j\.configurationFile=file:(\S+)", config.get("vmargs", ""))


def test_the_log_config_it_names_is_there_from_the_project_root():
    paths = log_config_paths(properties(SHIPPED.read_text()))
    assert paths, "config.properties gives TorchServe no log config"
    assert all((ROOT / path).is_file() for path in paths), paths
    assert (ROOT / paths[0]).resolve() == torchserve.LOG_CONFIG.resolve()  # the one `packrat serve` uses


def test_the_manual_runs_it_from_the_project_root():
    archive, start, stop = manual_commands()
    assert archive[:2] == ["packrat", "archive"] and stop == ["torchserve", "--stop", "--foreground"]
    assert start[:2] == ["torchserve", "--start"] and start[start.index("--ts-config") + 1] == "config.properties"
    assert start[start.index("--model-store") + 1] == properties(SHIPPED.read_text())["model_store"]


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("java") is None, reason="TorchServe needs Java 11+")
def test_torchserve_starts_from_it_as_the_manual_says(tmp_path, monkeypatch):
    """The manual's three commands, run in a stand-in for the project root: `packrat/` is the
    project's own (so vmargs' relative path resolves as it does from the root) and config.properties
    is the shipped file with free loopback ports in place of 8080-8082 and 7070-7071."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "packrat").symlink_to(ROOT / "packrat")
    ports = torchserve.Ports.free()
    moved = {"inference_address": f"http://127.0.0.1:{ports.inference}",
             "management_address": f"http://127.0.0.1:{ports.management}",
             "metrics_address": f"http://127.0.0.1:{ports.metrics}",
             "grpc_inference_port": str(ports.grpc_inference), "grpc_management_port": str(ports.grpc_management)}
    shipped = SHIPPED.read_text()
    assert set(moved) <= set(properties(shipped))
    config = "".join(f"{line.split('=', 1)[0]}={moved[line.split('=', 1)[0]]}\n" if line.split("=", 1)[0] in moved
                     else line + "\n" for line in shipped.splitlines())
    (root / "config.properties").write_text(config)
    assert {k: v for k, v in properties(config).items() if k not in moved} == \
        {k: v for k, v in properties(shipped).items() if k not in moved}

    archive, start, stop = manual_commands()
    profile = tmp_path / "tiny.csv"
    profile.write_text(PROFILE)
    monkeypatch.chdir(root)
    from packrat.cli.main import main
    assert main(["archive", "--model", "tiny", "--profile", str(profile), "--batch-size", "2"]) == 0
    assert (root / "model_store" / "tiny.mar").is_file()  # where the config's model_store looks

    # TEMP: the pid file and the worker sockets of this server alone (the suite runs others)
    server = torchserve.Server(root, "tiny", ports, token_auth=True)
    (root / "tmp").mkdir()
    bin_dir = Path(sys.executable).parent
    output = root / "torchserve.out"

    def run(command: list[str]) -> None:
        with output.open("a") as out:  # a file, not a pipe: Java inherits it
            done = subprocess.run([str(bin_dir / command[0]), *command[1:]], cwd=root, env=server.env(), stdout=out,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                  timeout=120)
        assert done.returncode == 0, f"{' '.join(command)}: {output.read_text()[-2000:]}"

    run(start)
    try:
        torchserve.wait_ready(server, 180)
        assert torchserve.worker_status(server) == ["READY"]  # through the management API, with its key
        request = urllib.request.Request(f"{server.inference_url}/predictions/tiny",
                                         data=torch.zeros(3, 32, 32).numpy().tobytes(),
                                         headers={"Content-Type": "application/octet-stream",
                                                  "Authorization": f"Bearer {server.key('inference')}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200 and len(json.loads(response.read())["predictions"]) == 5
    finally:
        run(stop)
    assert not torchserve.java_running(server)

    said = output.read_text()
    assert "Reconfiguration failed" not in said and "StatusLogger" not in said, said
    logs = root / "logs"
    assert "Reconfiguration failed" not in "".join(p.read_text(errors="replace") for p in logs.glob("*.log"))
    # packrat's log config took effect: its ts_log, and no access log (TorchServe's own config
    # writes a line per request to logs/access_log.log)
    assert (logs / "ts_log.log").is_file() and not (logs / "access_log.log").exists(), sorted(logs.iterdir())
