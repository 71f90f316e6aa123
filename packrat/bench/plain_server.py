"""The plain HTTP server a careful user writes instead of a serving system: FastAPI on uvicorn with
one ONNX Runtime session of the model (`packrat bench http` measures packrat's KServe server against it).

POST /v2/models/NAME/infer takes KServe v2 binary tensors (as tritonclient sends them) and answers
the same way; GET /v2/health/ready. Nothing is batched: a request is one session.run, in
Starlette's threadpool so the event loop reads on.

    python -m packrat.bench.plain_server --model squeezenet --port 8090 [--host 127.0.0.1]"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from fastapi import FastAPI, Request, Response  # at the top: FastAPI reads the route's annotations by name
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from packrat.bench.harness import wait_until

HEADER = "Inference-Header-Content-Length"
DTYPES = {"FP32": "<f4", "FP64": "<f8", "FP16": "<f2", "INT64": "<i8", "INT32": "<i4", "INT16": "<i2",
          "INT8": "i1", "UINT8": "u1", "BOOL": "?"}
ORT_TYPES = {"float": "FP32", "double": "FP64", "float16": "FP16", "int64": "INT64", "int32": "INT32",
             "int16": "INT16", "int8": "INT8", "uint8": "UINT8", "bool": "BOOL"}  # tensor(T) -> v2


class BadRequest(ValueError):
    """A body the server cannot read: answered 400 with its one-line reason."""


# ---- pure: the binary v2 request and answer ------------------------------------------------------

def parse_infer(body: bytes, header_length: str | None, inputs: dict[str, tuple[str, list]]) -> dict[str, np.ndarray]:
    """A binary v2 request's feeds by input name; `inputs`: name -> (v2 datatype, shape). One input takes any name."""
    if header_length is None:
        raise BadRequest(f"no {HEADER} header: send the tensors in binary, as tritonclient does")
    if not header_length.strip().isdecimal() or int(header_length) > len(body):
        raise BadRequest(f"{HEADER} {header_length[:20]!r} is no byte count within the {len(body)}-byte body")
    length = int(header_length)
    try:
        head = json.loads(body[:length])
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the inference header is not JSON: {str(exc).splitlines()[0]}") from None
    entries = head.get("inputs") if isinstance(head, dict) else None
    if not isinstance(entries, list) or len(entries) != len(inputs):
        raise BadRequest(f'"inputs" must list the model\'s {len(inputs)} input(s): {", ".join(inputs)}')
    feeds, offset = {}, length
    for entry in entries:
        name, array, offset = read_tensor(entry, body, offset, inputs)
        feeds[name] = array
    if offset != len(body) or len(feeds) != len(inputs):
        raise BadRequest("the inputs' binary_data_size do not add up to the body, or an input is given twice")
    return feeds


def read_tensor(entry, body: bytes, offset: int, inputs: dict) -> tuple[str, np.ndarray, int]:
    """(the session's input name, the array, the offset after its bytes) of one input entry."""
    try:
        name = next(iter(inputs)) if len(inputs) == 1 else entry["name"]
        datatype, shape = entry["datatype"], [int(n) for n in entry["shape"]]
        size = entry["parameters"]["binary_data_size"]
        expected_type, expected_shape = inputs[name]
    except (KeyError, TypeError, ValueError):
        raise BadRequest(f"each input needs a name of {', '.join(inputs)}, a datatype, a shape and "
                         f"parameters.binary_data_size") from None
    if datatype != expected_type or len(shape) != len(expected_shape) or any(
            isinstance(want, int) and want != got for want, got in zip(expected_shape, shape)):
        raise BadRequest(f"input {name!r} is {expected_type} {expected_shape}, not {datatype} {shape}")
    dtype = np.dtype(DTYPES[datatype])
    if size != math.prod(shape) * dtype.itemsize or offset + size > len(body):
        raise BadRequest(f"input {name!r}: binary_data_size {size} is not {datatype} {shape}, or runs past the body")
    return name, np.frombuffer(body, dtype, math.prod(shape), offset).reshape(shape), offset + size


def encode_answer(model: str, name: str, output: np.ndarray) -> tuple[bytes, int]:
    """(body, header length) of a binary v2 answer of one output tensor."""
    datatype = next(v2 for v2, code in DTYPES.items() if np.dtype(code) == output.dtype.newbyteorder("<"))
    data = np.ascontiguousarray(output, output.dtype.newbyteorder("<")).tobytes()
    head = {"model_name": model, "outputs": [{"name": name, "datatype": datatype, "shape": list(output.shape),
                                              "parameters": {"binary_data_size": len(data)}}]}
    header = json.dumps(head, separators=(",", ":")).encode()
    return header + data, len(header)


def session_inputs(session) -> dict[str, tuple[str, list]]:
    """{name: (v2 datatype, shape)} of an InferenceSession's inputs."""
    return {i.name: (ORT_TYPES.get(i.type.removeprefix("tensor(").removesuffix(")"), i.type), list(i.shape))
            for i in session.get_inputs()}


# ---- the server ----------------------------------------------------------------------------------

def plain_session(model: str):
    """One InferenceSession of packrat's ONNX file of the zoo model, intra-op threads = this process's cores."""
    from packrat.models.runtimes import OrtRunner, ensure_artefact
    from packrat.models.zoo import resolve

    spec = resolve(model)
    return OrtRunner(ensure_artefact(spec, "onnxruntime"), spec, 1, len(os.sched_getaffinity(0)), plain=True).session


def build_app(model: str, session):
    """The FastAPI app serving `session` as `model`."""
    inputs, output = session_inputs(session), session.get_outputs()[0].name
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/v2/health/ready")
    async def health():
        return {"ready": True}

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request):
        if name != model:
            return JSONResponse({"error": f"no model {name[:40]!r}: this server serves {model!r}"}, 404)
        try:
            feeds = parse_infer(await request.body(), request.headers.get(HEADER), inputs)
        except BadRequest as exc:
            return JSONResponse({"error": str(exc)}, 400)
        outputs = await run_in_threadpool(session.run, [output], feeds)  # off the event loop
        body, length = encode_answer(model, output, outputs[0])
        return Response(body, media_type="application/octet-stream", headers={HEADER: str(length)})

    return app


def loopback(host: str) -> str:
    """argparse type for --host: a loopback address only."""
    try:
        if host == "localhost" or ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{host}: this server listens on loopback only (e.g. 127.0.0.1)")


def main(argv=None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="squeezenet", help="zoo model (default squeezenet)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", type=loopback, default="127.0.0.1", help="a loopback address (default 127.0.0.1)")
    args = p.parse_args(argv)
    app = build_app(args.model, plain_session(args.model))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


# ---- run as a process (the bench, the tests) -----------------------------------------------------

def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def plain_serving(model: str, run_dir: Path, port: int, timeout: float = 300.0, log=print, cores=None):
    """The server in a process of its own on 127.0.0.1:`port` (log in run_dir): its URL once ready; SIGTERM on exit."""
    with plain_process(model, run_dir, port, timeout, log, cores) as (url, _):
        yield url


@contextmanager
def plain_process(model: str, run_dir: Path, port: int, timeout: float = 300.0, log=print, cores=None):
    """plain_serving's server: (its URL, its pid) once ready; pinned to `cores` (as many session threads)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    log(f"-- plain: starting FastAPI + ONNX Runtime on {url}" + (f", cores {list(cores)}" if cores else ""))
    with (run_dir / "plain-server.log").open("w") as out:
        pinned = ["taskset", "-c", ",".join(map(str, cores))] if cores else []  # exec: the same pid
        process = subprocess.Popen(pinned + [sys.executable, "-m", "packrat.bench.plain_server", "--model", model,
                                      "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        if not wait_until(lambda: ready(url) or process.poll() is not None, timeout, 0.2) or process.poll() is not None:
            raise RuntimeError(f"the plain server did not get ready; see {run_dir / 'plain-server.log'}")
        yield url, process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

if __name__ == "__main__":
    raise SystemExit(main())
