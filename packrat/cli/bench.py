"""`packrat bench`: fat vs planned (and stock), through real TorchServe with locust, or the pool alone
(the measuring: packrat/bench/server.py and pool.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from packrat.bench.pool import CASES, format_memory, format_pool_results, instance_memory, pool_bench
from packrat.bench.results import write_json
from packrat.bench.server import SERVER_CONFIGS, format_step_results, run_server_bench, step_bench
from packrat.bench.users import BATCH_USERS
from packrat.cli.args import model_args, tokenizer_path
from packrat.cli.bench_chaos import add_chaos_parser
from packrat.cli.bench_http import add_http_parser
from packrat.cli.bench_multi_model import add_multi_model_parser
from packrat.cli.bench_oracle import add_oracle_parser
from packrat.cli.bench_overload import add_overload_parser
from packrat.cli.bench_peers import add_peers_parser
from packrat.cli.types import int_list, name_list, positive, users_list
from packrat.models.runtimes import RUNTIMES
from packrat.serving.default_profile import resolve_profile
from packrat.profiling.profiles import load

POOL_ROUNDS = 20  # --pool-only's timed rounds unless --rounds says


def add_bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="load-test stock TorchServe, the fat plan and the packrat plan with locust",
                       description="For each batch size: (a) stock TorchServe (in-process handler, default "
                                   "workers, the model in the profile's graph mode), (b) the packrat handler with "
                                   "the fat plan, (c) the packrat handler with the planned instances; the servers "
                                   "started side by side and warmed up, then each loaded by locust headless once per "
                                   "--users pattern and round, in a rotated order (optionally killing pool "
                                   "instances, --kill-every). Prints p50/p95/p99, throughput, failures and kills "
                                   "(rounds pooled), and writes a PNG of the latency distributions and the JSON "
                                   "results. --pool-only measures the pool without TorchServe or Java: the bare "
                                   "model and the stock handler's path in this process against the fat and the "
                                   "planned pool, with the pools' stages.",
                       epilog="example: packrat bench --model resnet50 --batch-size 2,4,8 --duration 30\n"
                              "others: packrat bench peers --help, packrat bench oracle --help, packrat bench chaos --help, "
                              "packrat bench overload --help, packrat bench multi-model --help, "
                              "packrat bench http --help")
    model_args(p)
    p.add_argument("--batch-size", type=int_list, default=[8], help="batch sizes, e.g. 2,4,8 (default: 8)")
    p.add_argument("--duration", type=positive(float), default=30.0, help="seconds of load per run (default: 30)")
    p.add_argument("--users", type=users_list, default=[BATCH_USERS], metavar="PATTERNS",
                   help="locust users per run, relative to the batch size B: e.g. B,2B or 4,2B (integers, B, kB); "
                        "each is run against every configuration (default: B)")
    p.add_argument("--payload", choices=("jpeg", "text", "raw", "json"), default=None,
                   help="request body: jpeg (a 500x375 photo), text (an English paragraph), raw (tensor bytes), "
                        "json (nested lists) (default: the model's natural one: jpeg for image models, text for "
                        "token models, raw otherwise)")
    tok = p.add_mutually_exclusive_group()
    tok.add_argument("--tokenizer", type=tokenizer_path, default=None, metavar="DIR",
                     help="directory holding the tokenizer.json the servers use (needed for the text payload)")
    tok.add_argument("--demo-tokenizer", action="store_true",
                     help="build a small offline tokenizer into OUT/tokenizer/ and use it (BERT: WordPiece, "
                          "GPT-2: byte-level BPE)")
    p.add_argument("--kill-every", type=positive(float), default=None, metavar="S",
                   help="during each measured run of the packrat configurations, kill -9 one pool instance every "
                        "S seconds (round robin); the kills are counted in the table and JSON")
    p.add_argument("--configs", type=name_list([c[0] for c in SERVER_CONFIGS], "configuration"),
                   default=[c[0] for c in SERVER_CONFIGS], metavar="NAMES",
                   help="the servers, of stock,packrat-fat,packrat-plan (default: all); each is compared with "
                        "stock when stock is among them")
    p.add_argument("--stock-runtime", choices=RUNTIMES, default=None,
                   help="the engine the stock handler runs the model with (default: inductor, in the profile's "
                        "graph mode); e.g. onnxruntime, to compare with packrat instances that run it")
    p.add_argument("--max-batch-delay", type=positive(int), default=100, metavar="MS",
                   help="TorchServe's maxBatchDelay in every archive (default: 100)")
    p.add_argument("--pool-only", action="store_true",
                   help="no TorchServe: the model in-process, bare and through the stock handler's path "
                        "(decode, run, encode), against the fat and the planned pool answering the same bodies")
    p.add_argument("--cases", type=name_list(CASES, "case"), default=list(CASES), metavar="NAMES",
                   help=f"with --pool-only, which of {','.join(CASES)} (default: all). The in-process cases warm "
                        "each other (the bare model runs last in each round): the pool's tax is best measured "
                        "with in-process-codec,pool-fat")
    p.add_argument("--rounds", type=positive(int), default=None,
                   help="interleaved rounds. Through TorchServe: each configuration is loaded once per round, the "
                        "servers kept up side by side and taken in a rotated order, and its rounds pooled into one "
                        "row (default: 1). With --pool-only: timed rounds (default: 20)")
    p.add_argument("--shape", choices=("steady", "step"), default="steady",
                   help="step: a 1 ↔ B users step load against the packrat handler with reconfiguration on, "
                        "and with the plan fixed for B and for 1; draws timelines with the plan changes")
    p.add_argument("--cycles", type=positive(int), default=10, help="with --shape step: low/high cycles (default: 10)")
    p.add_argument("--step-seconds", type=positive(float), default=12.0,
                   help="with --shape step: seconds per step (default: 12)")
    p.add_argument("--memory", type=name_list(RUNTIMES, "runtime"), default=None, metavar="RUNTIMES",
                   help="instead of timing: the memory each instance of these runtimes adds (USS, MiB), two "
                        "one-thread instances each, e.g. onnxruntime-thread,onnxruntime (thread against process kind)")
    p.add_argument("--out", type=Path, default=Path("out/bench"), help="results directory (default: out/bench)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_bench)
    # Measurements of their own, with options of their own: `packrat bench oracle --help`. Without one,
    # `packrat bench` is the load test above.
    measurements = p.add_subparsers(dest="measurement", title="other measurements")
    add_peers_parser(measurements)
    add_oracle_parser(measurements)
    add_chaos_parser(measurements)
    add_overload_parser(measurements)
    add_multi_model_parser(measurements)
    add_http_parser(measurements)


def bench_tokenizer(model: str, payload: str, given: Path | None, demo: bool, out: Path) -> Path | None:
    """The tokenizer.json the servers get: --tokenizer, or with --demo-tokenizer one built into OUT/tokenizer/.
    A text payload without either is an error."""
    from packrat.codec.demo_tokenizers import build_demo_tokenizer, demo_tokenizer_kind
    from packrat.codec.payloads import natural_payload

    if demo:
        if natural_payload(model) != "text":
            raise ValueError(f"--demo-tokenizer is for token models (bert_base, gpt2); {model} takes no token ids")
        return build_demo_tokenizer(out / "tokenizer", demo_tokenizer_kind(model))
    if given is None and payload == "text":
        raise ValueError("the text payload needs a tokenizer: pass --tokenizer DIR (a directory holding "
                         "tokenizer.json), or --demo-tokenizer to build a small one")
    return given


def cmd_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from packrat.codec.payloads import check_payload, natural_payload

    out = args.out
    if args.memory:
        results = [instance_memory(args.model, runtime) for runtime in args.memory]
        write_json(out / "memory.json", results)
        print(json.dumps(results, indent=2) if args.json else format_memory(results))
        return 0
    payload = args.payload or natural_payload(args.model, args.input_shape)
    check_payload(args.model, payload, args.input_shape)
    tokenizer = bench_tokenizer(args.model, payload, args.tokenizer, args.demo_tokenizer, out)
    profile = resolve_profile(args.model, args.profile, batch_sizes=args.batch_size, input_shape=args.input_shape)
    if args.pool_only:
        results, rounds = [], args.rounds or POOL_ROUNDS
        for batch in args.batch_size:
            with tqdm(total=rounds, desc=f"pool bench B={batch}", disable=args.json) as bar:
                results.append(pool_bench(args.model, batch, profile, rounds, progress=bar.update, payload=payload,
                                          tokenizer=tokenizer, cases=args.cases))
            write_json(out / "pool-bench.json", results)  # after each batch size: an interrupted run keeps them
        print(json.dumps(results, indent=2) if args.json else format_pool_results(results))
        return 0
    if args.shape == "step":
        results = step_bench(args.model, args.batch_size[-1], profile, out, cycles=args.cycles,
                             step_s=args.step_seconds, payload=payload, tokenizer=tokenizer,
                             log=(lambda *_: None) if args.json else print)
        write_json(out / "step-bench.json", results)
        if args.json:
            print(json.dumps(json.loads((out / "step-bench.json").read_text()), indent=2))
        else:
            print(f"\nstep load 1 ↔ {args.batch_size[-1]} users, {args.cycles} cycles of "
                  f"{args.step_seconds:.0f} s steps, payload {payload} (locust on the same cores)")
            print(format_step_results(results))
            print("timelines: " + ", ".join(r["timeline"] for r in results.values()))
        return 0
    run_server_bench(args.model, args.batch_size, profile, out, args.duration, args.users, args.json,
                     payload=payload, tokenizer=tokenizer, kill_every=args.kill_every, rounds=args.rounds or 1,
                     graph_mode=load(profile).metadata.get("mode"), stock_runtime=args.stock_runtime,
                     configs=tuple(c for c in SERVER_CONFIGS if c[0] in args.configs),
                     max_batch_delay_ms=args.max_batch_delay)
    return 0

