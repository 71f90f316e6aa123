"""The pool's tax: one fat pool on every core (⟨1 instance, T threads, B⟩) against the same
compiled model and the same codec run in this process, as the stock handler runs them
(packrat.serving.inference.answer_batch), on the same request bodies, in interleaved rounds.

    .venv/bin/python benchmarks/pool_tax.py [--model resnet50] [--batches 4] [--rounds 20]
        [--graph-mode compile] [--threads T] [--payload KIND] [--json OUT]

Cases, per batch size B: "in-process" (decode, run and encode B requests in this process) and
"pool" (the same B requests through the fat pool, as TorchServe's ordinary worker hands them
over: together, gather 0 ms). Nothing else runs in between: a third case in this process (the
bare model, tried) warms the in-process path when it runs just before it, and made the pool look
4-11 % slower at B = 1 than without it (1.00-1.01). Bodies are the model's
natural payload (packrat.bench.payloads: a 500x375 JPEG photo for image models, an English
paragraph for token models) unless --payload says otherwise. Printed: the medians and the
pool / in-process ratio, then where the time goes: the pool's stages (median ms per sub-batch,
packrat.serving.pool.stages) beside the in-process decode, model and encode.

Compile mode (the default, as served) builds a package per batch size on first use, minutes each
for ResNet-50 (kept in ~/.cache/packrat/compiled): while iterating use --model tiny or
--graph-mode eager.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: benchmarks.common
from benchmarks.common import arguments, doc_parser, first_cores, fmt_num, markdown_table, pin
from packrat.bench.pool import answered
from packrat.bench.results import write_json
from packrat.bench.rounds import elapsed_ms, interleaved, medians as medians_of
from packrat.cli.types import int_list

IN_PROCESS_STAGES = ("decode", "model", "encode")  # the laps answer_batch stamps


def measure(args, batch: int, cores: list[int], scratch: Path) -> dict:
    """One batch size: the cases' medians, their ratio, and the stages of both paths."""
    import torch

    from packrat.codec.codec import Codec
    from packrat.bench.payloads import build_payload
    from packrat.models.zoo import prepare, resolve
    from packrat.serving.inference import answer_batch
    from packrat.serving.pool.api import InstanceConfig, ModelConfig, Request
    from packrat.serving.pool.instance_pool import InstancePool

    spec = resolve(args.model)
    body, content_type = build_payload(args.model, args.payload)
    module, _, mode = prepare(spec, batch, graph_mode=args.graph_mode)
    config = codec_config(spec, content_type, scratch)
    codec = Codec(config)
    requests = [Request(body, content_type)] * batch
    laps: list[list[float]] = []

    def in_process() -> float:
        stamps = [time.monotonic()]  # answer_batch adds the end of each of its stages
        answers = answer_batch(module, codec, [(body, content_type)] * batch, laps=stamps)
        if answers[0].status != 200:
            raise RuntimeError(f"in-process answer {answers[0].status}: {answers[0].reason}")
        laps.append(stamps)
        return (stamps[-1] - stamps[0]) * 1e3

    fat = [InstanceConfig(len(cores), batch, tuple(cores))]
    with InstancePool(ModelConfig(args.model, graph_mode=args.graph_mode), fat, config, gather_ms=0.0) as pool, \
            torch.inference_mode():
        cases = {"in-process": in_process, "pool": lambda: elapsed_ms(lambda: answered(pool, requests))}
        for case in cases.values():  # warm-up: every path once
            case()
        laps.clear()
        pool.stages.clear()
        medians = medians_of(interleaved(cases, args.rounds, random.Random(batch)))
        pool_stages = pool.stages.medians()
        per_sub_batch = pool.stages.requests_per_sub_batch()
    return {"batch": batch, "mode": mode, "median_ms": medians,
            "pool_vs_in_process": medians["pool"] / medians["in-process"], "pool_stage_ms": pool_stages,
            "requests_per_sub_batch": per_sub_batch, "in_process_stage_ms": lap_medians(laps)}


def codec_config(spec, content_type: str, scratch: Path):
    """The model's codec settings; for text bodies to a zoo model that ships no tokenizer (the
    zoo's BERT and GPT-2: seeded weights), a demo tokenizer built offline into `scratch`."""
    from packrat.codec.config import CodecConfig
    from packrat.bench.demo_tokenizers import build_demo_tokenizer, demo_tokenizer_kind

    config = CodecConfig.for_model(spec)
    if config.tokenizer is None and content_type.startswith("text/"):
        tokenizer = build_demo_tokenizer(scratch / "tokenizer", demo_tokenizer_kind(spec.name))
        config = CodecConfig.for_model(spec, tokenizer=str(tokenizer))
    return config


def lap_medians(laps: list[list[float]]) -> dict[str, float]:
    """Median ms of each in-process stage from the stamps [start, decoded, run, encoded] of each call."""
    return {stage: statistics.median((stamps[i + 1] - stamps[i]) * 1e3 for stamps in laps)
            for i, stage in enumerate(IN_PROCESS_STAGES)}


def report(args, results: list[dict]) -> str:
    head = f"{args.model}, T = {args.threads} threads, {args.rounds} interleaved rounds, medians in ms"
    figures = [[r["batch"], r["mode"], *(fmt_num(r["median_ms"][case]) for case in ("in-process", "pool")),
                f"{r['pool_vs_in_process']:.3f}"] for r in results]
    cases = markdown_table(["B", "mode", "in-process", "pool", "pool / in-process"], figures)
    stages = list(results[0]["pool_stage_ms"]) if results else []
    rows = [[stage, *(fmt_num(r["pool_stage_ms"].get(stage), 2) for r in results),
             *(fmt_num(r["in_process_stage_ms"].get(stage), 2) for r in results)] for stage in stages]
    breakdown = markdown_table(["stage", *(f"pool, B={r['batch']}" for r in results),
                                *(f"in-process, B={r['batch']}" for r in results)], rows)
    sizes = ", ".join(f"B={r['batch']}: {r['requests_per_sub_batch']:.2f}" for r in results)
    return f"{head}\n\n{cases}\n\nStages (median ms per batch; requests per pool sub-batch {sizes}):\n\n{breakdown}"


def main() -> None:
    from packrat.bench.payloads import PAYLOAD_KINDS

    parser = doc_parser(__doc__)
    parser.add_argument("--model", default="resnet50", help="zoo model (default resnet50)")
    parser.add_argument("--batches", type=int_list, default=[4], help="batch sizes (default 4)")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds (default 20)")
    parser.add_argument("--graph-mode", default="compile", help="graph mode of both paths (default compile)")
    parser.add_argument("--threads", type=int, default=None,
                        help="cores: the first T this process may use (default all)")
    parser.add_argument("--payload", choices=PAYLOAD_KINDS, default=None,
                        help="request bodies (default: the model's natural payload)")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the results as JSON")
    args = parser.parse_args()
    cores = first_cores(args.threads or 10**6)
    args.threads = len(cores)
    pin(cores)
    with tempfile.TemporaryDirectory() as scratch:
        results = [measure(args, batch, cores, Path(scratch)) for batch in args.batches]
    print(report(args, results))
    if args.json:
        write_json(args.json, {"arguments": arguments(args), "results": results})


if __name__ == "__main__":
    main()
