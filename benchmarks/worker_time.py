"""The TorchServe worker's own CPU time per request, packrat handler, JPEG payloads.

Serves MODEL (default resnet50) at batch size B (default 8) with the planned instances, loads it
with B locust users sending the synthetic JPEG for DURATION s, and reads the CPU time of the
TorchServe Python worker (the process that runs the handler; the instances are its children and
are not counted) before and after the load: CPU ms per request is what the worker itself spends.
Beside it, the CPU ms per request of decoding and encoding that JPEG in one process (what the
worker would add if it pre- and post-processed requests itself, as the handler did before the
codec moved into the instances), measured on the same machine in the same run.

    .venv/bin/python benchmarks/worker_time.py [MODEL] [B] [DURATION]
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import positional_args
from packrat.profiling.profiles import default_path as default_profile_path

from loadtest import run_locust
from packrat.codec.payloads import build_payload
from packrat.deploy import torchserve
from packrat.deploy import archive
from packrat.cli.compare import torchserve_pid
from packrat.codec.codec import Codec
from packrat.codec.config import CodecConfig
from packrat.models.zoo import resolve
from packrat.settings import Settings

model, batch, duration = positional_args(__doc__, ("model", str, "resnet50"), ("batch", int, 8),
                                         ("duration", float, 30.0))
profile = default_profile_path(model)
body, content_type = build_payload(model, "jpeg")


def codec_cpu_ms(rounds: int = 200) -> float:
    """CPU ms per request to decode the JPEG and encode a top-5 answer in this process."""
    spec = resolve(model)
    codec = Codec(CodecConfig.for_model(spec))
    torch.set_num_threads(1)
    output = torch.randn(1, 1000)
    start = time.process_time()
    for _ in range(rounds):
        codec.encode(output, codec.decode(body, content_type))
    return (time.process_time() - start) * 1e3 / rounds


def worker(java_pid: int) -> psutil.Process:
    (found,) = [p for p in psutil.Process(java_pid).children() if "model_service_worker" in " ".join(p.cmdline())]
    return found


with tempfile.TemporaryDirectory() as tmp:
    run_dir = Path(tmp)
    mar = archive.build(Settings(model, profiles=[profile], max_batch=batch, reconfigure=False), run_dir / "model_store")
    server = torchserve.start(torchserve.Server(run_dir, model, torchserve.Ports.free(), token_auth=True), mar)
    try:
        token = server.key("inference")
        run_locust(server.inference_url, model, batch, 8, run_dir / "warmup", token=token, payload=(body, content_type))
        process = worker(torchserve_pid(run_dir))
        before = process.cpu_times()
        result = run_locust(server.inference_url, model, batch, duration, run_dir / "load", token=token,
                            payload=(body, content_type))
        after = process.cpu_times()
    finally:
        torchserve.stop(server)
worker_ms = ((after.user - before.user) + (after.system - before.system)) * 1e3 / max(result.requests, 1)
codec_ms = codec_cpu_ms()
print(json.dumps({"model": model, "batch": batch, "users": batch, "payload_bytes": len(body),
                  "requests": result.requests, "failures": result.failures,
                  "worker_cpu_ms_per_request": round(worker_ms, 3),
                  "codec_cpu_ms_per_request_in_one_process": round(codec_ms, 3),
                  "worker_cpu_ms_per_request_if_it_decoded": round(worker_ms + codec_ms, 3)}, indent=2))
