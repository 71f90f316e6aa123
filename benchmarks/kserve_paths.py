"""What the KServe front end's ways of reaching the engine cost the server per request, in-process.

The server's one event loop runs every request's front-end work, so that work bounds what it can
serve. For one sample of --shape (FP32), as tritonclient and the KServe SDK send it, each path is
timed from the bytes received to the engine request built, and from the engine's binary answer
(--outputs FP32 values) to the bytes sent, with no pool:

  raw REST (JSON or binary)  the body handed on as it came (what packrat's routes do)
  KServe REST JSON           pydantic InferenceRequest, InferRequest, then the engine's binary body
  KServe REST binary         InferRequest.from_bytes (numpy, then Python lists), then the binary body
  gRPC                       ModelInferRequest parsed, InferRequest.from_grpc, the binary body; the
                             answer as an InferResponse of raw bytes and its ModelInferResponse

Each path runs --repeat times per round, --rounds interleaved rounds; the table gives the median
ms per request over the rounds (packrat/bench/rounds.py).
"""

from __future__ import annotations

import json

from packrat.bench.harness import doc_parser
from packrat.bench.results import markdown_table
from packrat.bench.rounds import interleaved

EXAMPLES = "example:\n  python benchmarks/kserve_paths.py --shape 3,224,224 --outputs 1000 --rounds 5 --repeat 50"


def parse_args(argv=None):
    p = doc_parser(__doc__, EXAMPLES)
    p.add_argument("--shape", default="3,224,224", help="one sample's shape (default: 3,224,224)")
    p.add_argument("--outputs", type=int, default=1000, help="values in the answer (default: 1000)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default: 5)")
    p.add_argument("--repeat", type=int, default=50, help="requests per path and round (default: 50)")
    return p.parse_args(argv)


def bodies(shape: list[int], outputs: int):
    """(JSON body, binary body and its header length, gRPC message bytes, the engine's binary answer)."""
    import numpy as np
    import tritonclient.http as http
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb

    from packrat.codec import oip

    x = np.random.default_rng(0).standard_normal([1, *shape]).astype(np.float32)
    given = http.InferInput("input", [1, *shape], "FP32")
    given.set_data_from_numpy(x, binary_data=False)
    json_body = http.InferenceServerClient.generate_request_body([given])[0]
    given.set_data_from_numpy(x)
    binary_body, length = http.InferenceServerClient.generate_request_body([given])
    message = pb.ModelInferRequest(model_name="m", inputs=[pb.ModelInferRequest.InferInputTensor(
        name="input", datatype="FP32", shape=[1, *shape])], raw_input_contents=[x.tobytes()]).SerializeToString()
    import torch

    head = {"model_name": "m", "outputs": [{"name": "output0", "shape": [1, outputs], "datatype": "FP32"}]}
    answer = oip.encode(head, [torch.zeros(1, outputs)])
    return json_body, (binary_body, length), message, answer


def paths(json_body: bytes, binary: tuple, message: bytes, answer: tuple) -> dict:
    """Each path's work for one request, as a function of nothing."""
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.infer_type import InferRequest
    from kserve.protocol.rest.v2_datamodels import InferenceRequest

    from packrat.frontends.kserve_server import infer_body, infer_response
    from packrat.serving.pool.api import Answer, Request

    reply = Answer(200, answer[0], "", "application/octet-stream", answer[1])

    def raw() -> None:
        Request(json_body, "application/json", None)

    def kserve_json() -> None:
        infer_body(InferRequest.from_inference_request(InferenceRequest.model_validate_json(json_body), "m"))

    def kserve_binary() -> None:
        infer_body(InferRequest.from_bytes(binary[0], binary[1], "m"))

    def grpc() -> None:
        request = InferRequest.from_grpc(pb.ModelInferRequest.FromString(message))
        infer_body(request)
        infer_response("m", request, reply).to_grpc().SerializeToString()

    return {"raw REST (JSON or binary)": raw, "KServe REST JSON": kserve_json, "KServe REST binary": kserve_binary,
            "gRPC": grpc}


def main(argv=None) -> int:
    import statistics
    import time

    args = parse_args(argv)
    shape = [int(n) for n in args.shape.split(",")]
    work = paths(*bodies(shape, args.outputs))

    def timed(fn):
        def run() -> float:
            started = time.perf_counter()
            for _ in range(args.repeat):
                fn()
            return (time.perf_counter() - started) * 1e3 / args.repeat
        return run

    samples = interleaved({name: timed(fn) for name, fn in work.items()}, args.rounds)
    rows = [[name, f"{statistics.median(ms):.3f}", f"{min(ms):.3f}-{max(ms):.3f}"] for name, ms in samples.items()]
    print(markdown_table(["path", "ms per request (median of rounds)", "rounds' range"], rows))
    print(json.dumps({"shape": shape, "outputs": args.outputs, "ms": samples}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
