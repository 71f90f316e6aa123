"""Real TorchServe (Java) on loopback with free ports, the packrat handler and the tiny model."""

from __future__ import annotations

import io
import json
import os
import shutil
import time
import urllib.error
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import torch

from packrat.deploy import torchserve
from packrat.deploy import archive
from packrat.models.zoo import prepare, resolve
from packrat.machine.topology import detect
from packrat.settings import Settings

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("java") is None, reason="TorchServe needs Java 11+")]

PROFILE = "threads,batch,latency_ms\n" + "".join(
    f"{t},{b},{b * 2.0 / t ** 0.5}\n" for t in range(1, detect().num_cores + 1) for b in (1, 2, 4))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("serve")
    profile = run_dir / "tiny.csv"
    profile.write_text(PROFILE)
    mar = archive.build(Settings("tiny", profiles=[profile], max_batch=4), run_dir / "model_store", max_batch_delay_ms=20)
    started = time.time()
    srv = torchserve.start(torchserve.Server(run_dir, "tiny", torchserve.Ports.free(), token_auth=True), mar, timeout=180)
    yield srv
    # The processes of this module's servers: Java's and every one under it (workers, their
    # instances, whose command line ends with their pool's pid), and any instance whose TEMP (its
    # server's) is under this session's temporary folder; not those of a test run beside this one.
    java = psutil.Process(int((run_dir / "tmp" / ".model_server.pid").read_text().strip()))
    processes = [java, *java.children(recursive=True)]
    ours, pids = {(p.pid, p.create_time()) for p in processes}, {str(p.pid) for p in processes}
    basetemp = str(tmp_path_factory.getbasetemp()) + os.sep
    torchserve.stop(srv)
    assert not torchserve.java_running(srv)

    def of_this_run(process: psutil.Process, cmdline: list[str]) -> bool:
        line = " ".join(cmdline)
        if str(run_dir) in line:
            return True
        if "packrat.serving.pool" not in line:
            return False
        try:
            return cmdline[-1] in pids or any(v.startswith(basetemp) for v in process.environ().values())
        except psutil.Error:
            return False

    deadline = time.monotonic() + 10  # an instance still loading notices within its watch interval
    while leftovers := [p for p in psutil.process_iter(["cmdline", "create_time", "status"])
                        if p.info["create_time"] >= started and p.info["status"] != psutil.STATUS_ZOMBIE and
                        ((p.pid, p.info["create_time"]) in ours or of_this_run(p, p.info["cmdline"] or []))]:
        assert time.monotonic() < deadline, f"instance processes outlived the server: {leftovers}"
        time.sleep(0.2)


def post(srv, body: bytes, content_type: str, token: str | None = "inference"):
    request = urllib.request.Request(f"{srv.inference_url}/predictions/tiny", data=body,
                                     headers={"Content-Type": content_type})
    if token:
        request.add_header("Authorization", f"Bearer {srv.key(token)}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_good_and_bad_requests_concurrently(server):
    module, _, _ = prepare(resolve("tiny"), 2, "eager")  # the model itself: nothing compiled for the reference
    samples = torch.randn(24, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        expected = [torch.softmax(row, 0).topk(5).indices.tolist() for row in module(samples)]

    def saved(x):
        buffer = io.BytesIO()
        torch.save(x, buffer)
        return buffer.getvalue()

    requests = []
    for i, x in enumerate(samples):
        kind = i % 4
        if kind == 0:
            requests.append((i, x.numpy().tobytes(), "application/octet-stream"))
        elif kind == 1:
            requests.append((i, json.dumps({"inputs": x.tolist()}).encode(), "application/json"))
        elif kind == 2:
            requests.append((i, saved(x), "application/octet-stream"))
        else:
            requests.append((i, b"\x00" * 100, "application/octet-stream"))  # malformed
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda r: post(server, r[1], r[2]), requests))
    for (i, _, _), (status, body) in zip(requests, answers):
        if i % 4 == 3:
            assert status == 400 and "wrong size: 100 bytes" in body
        else:
            assert status == 200, body
            assert [p["class"] for p in body["predictions"]] == expected[i]


def test_token_is_required(server):
    x = torch.zeros(3, 32, 32).numpy().tobytes()
    status, body = post(server, x, "application/octet-stream", token=None)
    assert status in (400, 401) and "token" in body.lower(), body
    assert post(server, x, "application/octet-stream")[0] == 200


def test_every_worker_ready_and_on_loopback(server):
    assert torchserve.worker_status(server) == ["READY"]
    config = (server.run_dir / "config.properties").read_text()
    assert "0.0.0.0" not in config and "http://127.0.0.1:" in config


def test_cli_serve_and_stop(tmp_path, capsys):
    from packrat.cli.main import main

    profile = tmp_path / "tiny.csv"
    profile.write_text(PROFILE)
    run_dir = tmp_path / "run"
    ports = [str(torchserve.free_port()) for _ in range(5)]
    argv = ["serve", "--model", "tiny", "--profile", str(profile), "--batch-size", "2", "--run-dir", str(run_dir),
            "--inference-port", ports[0], "--management-port", ports[1], "--metrics-port", ports[2],
            "--grpc-inference-port", ports[3], "--grpc-management-port", ports[4], "--disable-token-auth",
            "--cores", "1"]
    try:
        assert main(argv) == 0
        out = capsys.readouterr().out  # the handler's budget, from the archive's `cores`, and its profile
        assert "CPU budget: 1 core (the archive's `cores` setting: 1 of the " in out
        assert "profile: profile.csv: taken on unknown CPU" in out
        assert "packrat CPU budget: 1 core (" in (run_dir / "logs" / "model_log.log").read_text()
        server = torchserve.Server.load(run_dir)
        assert server.ports.inference == int(ports[0]) and not server.token_auth
        body = torch.zeros(3, 32, 32).numpy().tobytes()
        assert post(server, body, "application/octet-stream", token=None)[0] == 200
    finally:
        assert main(["stop", "--run-dir", str(run_dir)]) == 0
    assert not torchserve.java_running(torchserve.Server.load(run_dir))


def test_two_servers_under_one_long_tmpdir_keep_their_own_pid_files_and_sockets(tmp_path, monkeypatch):
    """TMPDIR set (TorchServe finds its pid file with tempfile.gettempdir(), which reads it first) and
    long (a worker's socket path must fit 107 bytes): two servers started under it, one with its run
    dir inside it, each serve, and stopping one leaves the other serving."""
    shared = tmp_path / ("t" * 90)
    shared.mkdir()
    monkeypatch.setenv("TMPDIR", str(shared))
    profile = tmp_path / "tiny.csv"
    profile.write_text(PROFILE)
    mar = archive.build(Settings("tiny", profiles=[profile], max_batch=2), tmp_path / "store", max_batch_delay_ms=20)
    servers = []
    try:
        for run_dir in (shared / "run", tmp_path / "short"):
            servers.append(torchserve.start(torchserve.Server(run_dir, "tiny", torchserve.Ports.free(), token_auth=False),
                                            mar, timeout=180))
        long, short = servers
        assert long.temp_link is not None and short.temp_link is None
        body = torch.zeros(3, 32, 32).numpy().tobytes()
        assert [post(s, body, "application/octet-stream", token=None)[0] for s in servers] == [200, 200]
        assert not (shared / ".model_server.pid").exists()  # each in its own run dir
        torchserve.stop(long)
        assert not torchserve.java_running(long) and torchserve.java_running(short)
        assert not long.temp_link.is_symlink()
        assert post(short, body, "application/octet-stream", token=None)[0] == 200
    finally:
        for server in servers:
            torchserve.stop(server)


def test_cli_serve_without_profile_says_what_to_do(tmp_path, capsys):
    from packrat.cli.main import main

    assert main(["serve", "--model", "tiny", "--profile", str(tmp_path / "none.csv")]) == 2
    assert "run `packrat profile --model tiny" in capsys.readouterr().err


def test_a_profile_of_ios_instances_is_served_by_them(tmp_path):
    """The archive follows its profile: IOS-compiled instances, with the cached schedules inside."""
    from packrat.ios_scheduler.cache import cached_schedule

    spec = resolve("tiny")
    cache = tmp_path / "schedules"
    for threads in (1, 2):
        for batch in (1, 2):
            cached_schedule(spec.build(), spec.example_inputs(batch), "tiny", threads, cache)
    profile = tmp_path / "tiny-ios.csv"
    profile.write_text("# model: tiny\n# mode: ios\nthreads,batch,latency_ms\n"
                       + "".join(f"{t},{b},{b * 2.0 / t ** 0.5}\n" for t in (1, 2) for b in (1, 2)))
    run_dir = tmp_path / "run"
    mar = archive.build(Settings("tiny", profiles=[profile], max_batch=2), run_dir / "model_store",
                        max_batch_delay_ms=20, ios_cache=cache)
    with zipfile.ZipFile(mar) as packed:
        assert {f"tiny-t{t}-b{b}.json" for t in (1, 2) for b in (1, 2)} <= set(packed.namelist())
    server = torchserve.start(torchserve.Server(run_dir, "tiny", torchserve.Ports.free(), token_auth=False), mar, timeout=180)
    try:
        x = torch.randn(3, 32, 32)
        module, _, _ = prepare(spec, 1, "eager")
        with torch.inference_mode():
            top5 = torch.softmax(module(x[None])[0], 0).topk(5).indices.tolist()
        status, body = post(server, x.numpy().tobytes(), "application/octet-stream", token=None)
        assert status == 200 and [p["class"] for p in body["predictions"]] == top5
        status = torchserve.handler_status(server)
        assert status["mode"] == "ios"
        assert status["ios"] and all(g["runtime"] == "ios" and g.get("against") is None for g in status["ios"])  # nulls dropped
        used = list((run_dir / "tmp").rglob("tiny-t*-b*.json"))  # the archive as TorchServe unpacked it
        assert used and all(path.read_text() == (cache / path.name).read_text() for path in used)  # not searched again
    finally:
        torchserve.stop(server)
