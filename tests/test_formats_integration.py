"""What TorchServe users send, end to end through real TorchServe (Java) with token auth on:
images, base64 JSON, KServe v1/v2, tritonclient over the Open Inference Protocol (binary tensors),
text with a shipped tokenizer, labels; bad requests answered alone in shared batches; size limits;
an instance killed twice and the worker killed, losing no request."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from PIL import Image

from packrat.codec.demo_tokenizers import build_demo_tokenizer
from packrat.deploy import torchserve
from packrat.deploy import archive
from packrat.bench.faults import pool_instances, torchserve_pid
from packrat.codec.codec import Codec
from packrat.codec.config import CodecConfig
from packrat.codec.batch import answer_batch
from packrat.models.zoo import prepare, resolve
from packrat.machine.topology import detect
from packrat.settings import Settings

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("java") is None, reason="TorchServe needs Java 11+"),
              pytest.mark.skipif(shutil.which("curl") is None, reason="sends what curl sends, with curl")]

PROFILE = "threads,batch,latency_ms\n" + "".join(
    f"{t},{b},{b * 2.0 / t ** 0.5}\n" for t in range(1, detect().num_cores + 1) for b in (1, 2, 4))
LABELS = {str(i): ["n%08d" % i, f"class-{i}"] for i in range(10)}
MAX_BODY = 2**20


def image_bytes(fmt: str, size=(64, 48), seed: int = 0) -> bytes:
    gen = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(size[1], size[0], 3, generator=gen) * 255).to(torch.uint8).numpy()
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def huge_png() -> bytes:
    """A valid small PNG whose header claims 20000 x 20000 pixels: the decompression-bomb shape."""
    import struct
    import zlib

    png = bytearray(image_bytes("PNG", (8, 8)))
    png[16:24] = struct.pack(">II", 20000, 20000)  # IHDR width, height
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])))  # IHDR CRC over type + data
    return bytes(png)


def build(run_dir: Path, model: str, name: str | None = None, **settings) -> Path:
    profile = run_dir / "profile.csv"
    profile.write_text(PROFILE)
    return archive.build(Settings(model, profiles=[profile], max_batch=4, **settings), run_dir / "model_store",
                         name=name)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One TorchServe (one Java start and stop, not one per model) for the image and the text tests
    and the one that kills instances and a worker: tiny with labels and a body limit, tiny_text
    with a shipped tokenizer (the two plan the cores together, as models on one server do), and
    tiny once more as "tiny_alone": one instance (plan fat), out of the node (share_node off), so
    that no move of the node's plan starts or parks an instance while that test counts them;
    (server, tokenizer)."""
    labels = tmp_path_factory.mktemp("labels") / "index_to_name.json"
    labels.write_text(json.dumps(LABELS))
    tokenizer = build_demo_tokenizer(tmp_path_factory.mktemp("tokenizer"), "wordpiece",
                                     text="the quick brown fox jumps over the lazy dog")
    mars = [build(tmp_path_factory.mktemp("tiny"), "tiny", labels=labels, max_body_bytes=MAX_BODY),
            build(tmp_path_factory.mktemp("tiny_text"), "tiny_text", tokenizer=tokenizer),
            build(tmp_path_factory.mktemp("tiny_alone"), "tiny", name="tiny_alone", plan="fat", share_node=False)]
    server = torchserve.Server(tmp_path_factory.mktemp("served"), "tiny", torchserve.Ports.free(), token_auth=True,
                               oip=True, models=("tiny", "tiny_text", "tiny_alone"))
    srv = torchserve.start(server, mars, timeout=180)
    yield srv, tokenizer
    torchserve.stop(srv)


@pytest.fixture(scope="module")
def images(served):
    return served[0]


def post(srv, body: bytes, content_type: str | None, model: str | None = None, method: str = "POST",
         timeout: float = 60):
    request = urllib.request.Request(f"{srv.inference_url}/predictions/{model or srv.model}", data=body,
                                     method=method)
    if content_type:
        request.add_header("Content-Type", content_type)
    request.add_header("Authorization", f"Bearer {srv.key('inference')}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def curl(srv, body: bytes, how: str, header: str | None = None, tmp=Path(tempfile.gettempdir())):
    """(status, JSON body) of the real curl sending `body` from a file with `how` (-T or --data-binary)."""
    path = tmp / f"packrat-curl-{os.getpid()}.bin"
    path.write_bytes(body)
    try:
        cmd = ["curl", "-s", "-o", "-", "-w", "\n%{http_code}", "-H", f"Authorization: Bearer {srv.key('inference')}",
               *(["-H", header] if header else []), how, ("@" if how != "-T" else "") + str(path),
               f"{srv.inference_url}/predictions/{srv.model}"]
        out = subprocess.run(cmd, capture_output=True, timeout=120).stdout.decode()
    finally:
        path.unlink()
    text, _, code = out.rpartition("\n")
    return int(code), (json.loads(text) if text.strip() else {})


def expected_classes(body: bytes, content_type: str | None) -> list[int]:
    """What the model says about this body in this process (same codec, same model)."""
    spec = resolve("tiny")
    module, _, _ = prepare(spec, 1, "eager")  # the model itself: nothing compiled for the reference
    (reply,) = answer_batch(module, Codec(CodecConfig.for_model(spec)), [(body, content_type)])
    assert reply.status == 200
    return [p["class"] for p in json.loads(reply.body)["predictions"]]


def test_image_formats(images):
    jpeg, png, webp = image_bytes("JPEG"), image_bytes("PNG", seed=1), image_bytes("WEBP", seed=2)
    classes = expected_classes(jpeg, "image/jpeg")
    status, body = post(images, jpeg, "image/jpeg")
    assert status == 200 and [p["class"] for p in body["predictions"]] == classes
    assert body["predictions"][0]["label"] == f"class-{classes[0]}"  # the archive's index_to_name.json
    # `curl -T file`: a PUT with no Content-Type, recognised by its magic bytes
    status, body = curl(images, png, "-T")
    assert status == 200 and [p["class"] for p in body["predictions"]] == expected_classes(png, None)

    status, body = post(images, webp, "application/octet-stream")
    assert status == 200 and len(body["predictions"]) == 5
    b64 = base64.b64encode(jpeg).decode()
    status, body = post(images, json.dumps({"data": b64}).encode(), "application/json")
    assert status == 200 and [p["class"] for p in body["predictions"]] == classes
    status, body = post(images, json.dumps({"instances": [{"data": b64}, {"data": b64}]}).encode(),
                        "application/json")  # KServe v1
    assert status == 200 and [[p["class"] for p in pred] for pred in
                              (a["predictions"] for a in body["predictions"])] == [classes, classes]


def test_kserve_v2_tensors(images):
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    request = {"id": "r1", "inputs": [{"name": "input0", "shape": [2, 3, 32, 32], "datatype": "FP32",
                                       "data": x.flatten().tolist()}]}
    status, body = post(images, json.dumps(request).encode(), "application/json")
    assert status == 200 and body["id"] == "r1" and body["model_name"] == "tiny"
    (output,) = body["outputs"]
    assert output["shape"] == [2, 10] and output["datatype"] == "FP32"
    module, _, _ = prepare(resolve("tiny"), 2, "eager")
    with torch.inference_mode():
        torch.testing.assert_close(torch.tensor(output["data"]).view(2, 10), module(x), rtol=1e-4, atol=1e-4)


def test_each_bad_request_fails_alone_beside_good_ones(images):
    """Sent concurrently so they share TorchServe's batches and the instances' sub-batches."""
    jpeg = image_bytes("JPEG")
    bad = {
        "deeply nested JSON": (b"[" * 100_000 + b"]" * 100_000, "application/json", 400),
        "NaN": (b'{"inputs": [[NaN]]}', "application/json", 400),
        "Infinity in v2": (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [Infinity]}]}',
                           "application/json", 400),
        "wrong dtype": (json.dumps({"inputs": [{"name": "x", "shape": [3, 32, 32], "datatype": "BOOL",
                                                "data": [True] * 3072}]}).encode(), "application/json", 400),
        "wrong shape": (json.dumps({"inputs": [[1.0, 2.0]]}).encode(), "application/json", 400),
        "empty": (b"", "application/octet-stream", 400),
        "not an image": (b"GIF89a this is not really a gif", "image/gif", 400),
        "truncated image": (jpeg[: len(jpeg) // 2], "image/jpeg", 400),
        "decompression bomb": (huge_png(), "image/png", 413),
        "too large": (b"\xff\xd8\xff" + b"\0" * (MAX_BODY + 10), "image/jpeg", 413),
    }
    requests = [(None, jpeg, "image/jpeg", 200)] * 8 + [(name, *case) for name, case in bad.items()]
    requests = [requests[i] for i in sorted(range(len(requests)), key=lambda i: (i * 7) % len(requests))]
    with ThreadPoolExecutor(len(requests)) as threads:
        answers = list(threads.map(lambda r: post(images, r[1], r[2]), requests))
    classes = expected_classes(jpeg, "image/jpeg")
    for (name, _, _, want), (status, body) in zip(requests, answers):
        assert status == want, (name, status, body)
        if want == 200:
            assert [p["class"] for p in body["predictions"]] == classes
        else:
            assert set(body) == {"error"} and body["error"] and "\n" not in body["error"], (name, body)


def test_body_over_torchserve_limit_is_413_not_a_reset(images):
    """Above the handler's own limit it answers 413 with the reason (see the batch test); above
    TorchServe's max_request_size TorchServe answers 413 itself (to a client that sends
    Expect: 100-continue, as curl does, before the body is sent)."""
    status, _ = curl(images, b"\0" * (torchserve.MAX_REQUEST_SIZE + 1024), "--data-binary",
                     "Content-Type: application/octet-stream")
    assert status == 413


def test_tritonclient_over_the_open_inference_protocol(images, text_server):
    """tritonclient.http as it comes: binary tensors both ways by default, JSON when asked; several
    named inputs; a malformed binary body answered 400 alone beside good ones in shared batches."""
    http = pytest.importorskip("tritonclient.http")
    client = http.InferenceServerClient(f"127.0.0.1:{images.ports.inference}", network_timeout=120)
    auth = {"Authorization": f"Bearer {images.key('inference')}"}
    assert client.is_server_live(headers=auth) and client.is_server_ready(headers=auth)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    module, _, _ = prepare(resolve("tiny"), 2, "eager")
    with torch.inference_mode():
        want = module(x).numpy()
    for binary in (True, False):
        given = http.InferInput("input0", [2, 3, 32, 32], "FP32")
        given.set_data_from_numpy(x.numpy(), binary_data=binary)
        result = client.infer("tiny", [given], outputs=[http.InferRequestedOutput("output0", binary_data=binary)],
                              request_id="r1", headers=dict(auth))  # infer() adds its header length to it
        assert ("data" in result.get_output("output0")) is not binary and result.get_response()["id"] == "r1"
        np.testing.assert_allclose(result.as_numpy("output0"), want, rtol=1e-4, atol=1e-4)

    header = json.dumps({"inputs": [{"name": "x", "shape": [1, 3, 32, 32], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 3 * 32 * 32 * 4}}]}).encode()
    good = (header + x[0].numpy().tobytes(), str(len(header)))
    bad = {"cut short": (good[0][:-4], good[1]), "header length beyond the body": (good[0], str(len(good[0]) + 1)),
           "header length not a number": (good[0], "twelve")}
    requests = [("good", *good)] * 6 + [(name, *case) for name, case in bad.items()]

    def send(request):
        name, body, length = request
        posted = urllib.request.Request(f"{images.inference_url}/v2/models/tiny/infer", data=body, method="POST",
                                        headers={**auth, "Content-Type": "application/octet-stream",
                                                 "inference-header-content-length": length})  # any case
        try:
            with urllib.request.urlopen(posted, timeout=60) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    with ThreadPoolExecutor(len(requests)) as threads:
        answers = list(threads.map(send, requests))  # at once: they share TorchServe's batches
    for (name, _, _), (status, headers, body) in zip(requests, answers):
        if name == "good":  # no outputs named and no binary_data_output: JSON
            assert status == 200 and headers["content-type"].startswith("application/json"), (status, body)
            np.testing.assert_allclose(json.loads(body)["outputs"][0]["data"], want[0].flatten(), rtol=1e-4, atol=1e-4)
        else:
            reason = json.loads(body)["error"]
            assert status == 400 and reason and "\n" not in reason, (name, status, body)

    srv, _ = text_server  # several named inputs, binary, as INT64 token ids and mask
    ids = torch.tensor([[2, 7, 9, 11, 3] + [0] * 11])
    mask = (ids != 0).long()
    given = [http.InferInput("input_ids", [1, 16], "INT64"), http.InferInput("attention_mask", [1, 16], "INT64")]
    for tensor, value in zip(given, (ids, mask)):
        tensor.set_data_from_numpy(value.numpy())
    text = http.InferenceServerClient(f"127.0.0.1:{srv.ports.inference}", network_timeout=120)
    result = text.infer("tiny_text", given, headers={"Authorization": f"Bearer {srv.key('inference')}"})
    module, _, _ = prepare(resolve("tiny_text"), 1, "eager")
    with torch.inference_mode():
        np.testing.assert_allclose(result.as_numpy("output0"), module(ids, mask).numpy(), rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def text_server(served):
    srv, tokenizer = served
    return dataclasses.replace(srv, model="tiny_text"), tokenizer  # the same server, asked about tiny_text


def test_text_with_the_shipped_tokenizer(text_server):
    srv, tokenizer = text_server
    spec = resolve("tiny_text")
    module, _, _ = prepare(spec, 1, "eager")
    codec = Codec(CodecConfig.for_model(spec, tokenizer=str(tokenizer)))
    (want,) = answer_batch(module, codec, [(b"the quick brown fox", "text/plain")])
    status, body = post(srv, b"the quick brown fox", "text/plain; charset=utf-8")
    assert status == 200 and body["embedding"] == pytest.approx(json.loads(want.body)["embedding"], abs=1e-5)
    status, again = post(srv, json.dumps({"text": "the quick brown fox"}).encode(), "application/json")
    assert status == 200 and again["embedding"] == pytest.approx(body["embedding"], abs=1e-5)
    status, body = post(srv, " ".join(["dog"] * 40).encode(), "text/plain")
    assert status == 413 and "too long" in body["error"]


def worker_of(srv) -> psutil.Process:
    """The TorchServe worker (Python) serving srv.model, by the pid the management API gives."""
    request = urllib.request.Request(f"{srv.management_url}/models/{srv.model}",
                                     headers={"Authorization": f"Bearer {srv.key('management')}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        (worker,) = [w for entry in json.loads(response.read()) for w in entry["workers"]]
    return psutil.Process(worker["pid"])


@pytest.fixture(scope="module")
def alone(served):
    srv, _ = served
    return dataclasses.replace(srv, model="tiny_alone")  # the same server, asked about tiny_alone


def test_instance_killed_twice_and_the_worker_killed_lose_no_request(alone):
    """kill -9 of the only instance, then of its replacement while it starts: requests sent meanwhile
    wait for the next respawn and are answered (a fault that heals in seconds costs no request).
    Then kill -9 of the TorchServe Python worker: TorchServe restarts it, the old worker's instances
    exit, no shared-memory segment of it is left, and the new worker serves. (The shared server's
    tiny_alone; the models beside it are left alone.)"""
    srv = alone
    jpeg = image_bytes("JPEG")

    def instances(root: int) -> list[int]:
        return [p.pid for p in pool_instances(root)]

    assert post(srv, jpeg, "image/jpeg")[0] == 200
    worker = worker_of(srv)
    (first,) = instances(worker.pid)
    os.kill(first, signal.SIGKILL)  # the pool notices at once: it watches every instance's socket
    deadline = time.monotonic() + 30
    while not (found := [p for p in instances(worker.pid) if p != first]):
        assert time.monotonic() < deadline, "no replacement was started"
        time.sleep(0.01)
    os.kill(found[0], signal.SIGKILL)
    with ThreadPoolExecutor(4) as clients:
        statuses = list(clients.map(lambda _: post(srv, jpeg, "image/jpeg")[0], range(8)))
    assert statuses == [200] * 8
    health = torchserve.handler_status(srv)["health"]
    assert health["ready"] == 1 and not health.get("unavailable") and health["respawn_failures"] >= 1
    assert health["refused"] == 0

    old_instances = instances(worker.pid)
    worker.kill()
    deadline = time.monotonic() + 120
    while True:  # TorchServe restarts the worker; what it does with requests meanwhile is its own
        with contextlib.suppress(TimeoutError, urllib.error.URLError):
            if post(srv, jpeg, "image/jpeg", timeout=5)[0] == 200:
                break
        assert time.monotonic() < deadline, "the restarted worker did not serve"
        time.sleep(0.5)
    torchserve.wait_ready(srv, 60)
    assert worker_of(srv).pid != worker.pid
    assert not set(old_instances) & set(instances(torchserve_pid(srv.run_dir))), "the dead worker's instances outlived it"
    assert not [p for p in Path("/dev/shm").glob(f"packrat-{worker.pid}-*")], "stale segments"
